"""The papers' claims, tested by a run: one row per claim with the paper's evidence, this run's, whether this run
reproduces the paper's numbers, an interval and a verdict computed by a stated rule (:mod:`esrepro.report.verdicts`).

- :mod:`.catalogue`: the claims, where each paper makes them, their wording and rules;
- :mod:`.evidence`: the files a row reads, picked from the rule's declared inputs by the row's selectors;
- :mod:`.countdown`, :mod:`.conciseness`, :mod:`.math_puzzles`, :mod:`.essa`: each paper section's rules;
- :mod:`.rows`: what the rules share (the margin comparison, the reproduced check, short cells);
- :mod:`.table`: the scale gate, the table in CSV, Markdown and LaTeX, the margins figure.

The package itself imports nothing: the planning rooms read the catalogue without loading pandas (whose pyarrow
starts a thread, which the preloaded interpreter of esrepro.runtime.forkserver must not have).
"""
