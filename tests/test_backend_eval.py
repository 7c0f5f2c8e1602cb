"""The transformers backend and greedy evaluation."""

from __future__ import annotations

from esrepro.backends.hf import HFBackend
from esrepro.evaluate import evaluate
from esrepro.tasks.countdown import CountdownTask, generate_problems


def test_greedy_generation_is_deterministic_and_batch_independent(tiny_model_dir):
    prompts = ["Using the numbers [1 2], make 3.", "<answer>", "a much longer prompt " * 5]
    one = HFBackend(tiny_model_dir, batch_size=1).generate(prompts, 8)
    three = HFBackend(tiny_model_dir, batch_size=3).generate(prompts, 8)
    assert one == HFBackend(tiny_model_dir, batch_size=1).generate(prompts, 8)
    assert one == three
    assert all(isinstance(r, str) for r in one)


def test_long_prompts_are_left_truncated_and_counted(tiny_model_dir):
    backend = HFBackend(tiny_model_dir, batch_size=2, max_prompt_tokens=6)
    long = "1 2 3 4 5 6 7 8 9 " * 4
    out = backend.generate([long, "7 8 9"], 4)
    assert len(out) == 2 and backend.truncated == 1
    # the kept tail is what the model sees: same continuation as the tail alone
    tail_ids = backend.tokenizer(long, add_special_tokens=False)["input_ids"][-6:]
    tail = backend.tokenizer.decode(tail_ids)
    assert out[0] == HFBackend(tiny_model_dir).generate([tail], 4)[0]


def test_evaluate_writes_one_row_per_example(tiny_model_dir):
    task = CountdownTask()
    examples = generate_problems(5, seed=0)
    result = evaluate(HFBackend(tiny_model_dir), task, examples, max_new_tokens=6, batch_size=2, progress=False)
    assert [r["id"] for r in result.responses] == [e["id"] for e in examples]
    assert result.metrics["n"] == 5
    assert 0.0 <= result.metrics["accuracy"] <= 1.0
    assert result.metrics["mean_reward"] == sum(r["reward"] for r in result.responses) / 5
