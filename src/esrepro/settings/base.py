"""The base of every settings class: pydantic models that refuse unknown keys and carry help text.

Every option of the pipeline is a field of one of these classes, defined once with its
default, its bounds and a one-line description. The JSON schemas in workflow/schemas,
config/README.md and ``esrepro options`` are generated from the same fields.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from pydantic import BaseModel, ConfigDict, ValidationError


class FieldProblem(ValueError):
    """A problem a whole-block check found, pinned on the field that caused it (for the error's location)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class Settings(BaseModel):
    """A block of options: unknown keys are errors, values are immutable once validated."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values (what rules pass as ``--spec`` and manifests record)."""
        return self.model_dump(mode="json")


def dotted(loc: Iterable[Any]) -> str:
    """A pydantic error location as a dotted field path (``train.countdown.es.sigma``)."""
    return ".".join(str(p) for p in loc)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


#: Per algorithm, its settings' names before a rename (current name -> former name): grid-cell directory names,
#: Table 3 and kl.json's hyper are written with these (settings.methods.with_former_names), so run paths and those
#: outputs stay as they were.
FORMER_NAMES: dict[str, dict[str, str]] = {
    "grpo": {"max_new_tokens": "max_completion_length"},
    "dr_grpo": {"max_new_tokens": "max_completion_length"},
    "ppo": {"beta": "kl_coef", "prompts_per_step": "batch_size"},
    "essa": {"iterations": "generations", "sft_prompts_per_step": "sft_batch_size"},
}
#: The same for options outside the method blocks, per block (as ``esrepro options`` names them): the tiny model's
#: warm start (``sft``: models.<key>.build.sft) and a sweep study (``study``: studies.<name>, whose one model became
#: a list).
FORMER_BLOCK_NAMES: dict[str, dict[str, str]] = {
    "sft": {"prompts_per_step": "batch_size"},
    "study": {"models": "model"},
}


def _renamed(*maps: dict[str, dict[str, str]]) -> dict[str, str]:
    """Old name -> current name from per-block (current -> former) maps; an old name has one current name."""
    out: dict[str, str] = {}
    for names in (n for m in maps for n in m.values()):
        for new, old in names.items():
            if out.setdefault(old, new) != new:
                raise AssertionError(f"{old} was renamed to both {out[old]} and {new}: one name per meaning")
    return out


#: Options renamed so that one name means one thing across the config: old name -> current name.
RENAMED: dict[str, str] = _renamed(FORMER_NAMES, FORMER_BLOCK_NAMES)


def renamed(name: Any, known: Iterable[str]) -> str:
    """``"; renamed: use <new>"`` when ``name`` is the old name of one of ``known``, else ``""``."""
    new = RENAMED.get(str(name))
    return f"; renamed: use {new}" if new is not None and new in known else ""


def unknown_key(name: Any, known: Iterable[str]) -> str:
    """Why ``name`` is refused where ``known`` are the options: renamed (to one of them), else a did-you-mean."""
    import difflib

    known = list(known)
    hint = renamed(name, known)
    if not hint:
        close = difflib.get_close_matches(str(name), known, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else ""
    return "not an option here" + hint


def _model_in(ann: Any) -> Any:
    """The settings class inside an annotation (``X``, ``X | None``), else the annotation."""
    import typing

    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann
    if typing.get_origin(ann) is dict:
        return ann
    for arg in typing.get_args(ann):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return ann


def _fields_at(cls: Any, loc: tuple) -> list[str]:
    """Field names of the (nested) settings class that holds the last element of ``loc``."""
    import typing

    node: Any = cls
    for part in loc[:-1]:
        if isinstance(node, type) and issubclass(node, BaseModel):
            info = node.model_fields.get(str(part))
            node = _model_in(info.annotation) if info else None
        elif typing.get_origin(node) is dict:  # dict[str, X]: ``part`` is a key
            node = _model_in(typing.get_args(node)[1])
        else:
            return []
    return list(node.model_fields) if isinstance(node, type) and issubclass(node, BaseModel) else []


def error_lines(exc: ValidationError, where: Callable[[tuple], str], cls: type[BaseModel] | None = None) -> list[str]:
    """One line per validation error: ``<where(loc)>: <value>: <message>``.

    ``where`` turns an error location into ``file: field.path``; a missing field is
    reported without a value, an unknown one as "not an option" (with its new name if it was renamed).
    """
    lines = []
    for err in exc.errors(include_url=False):
        loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        msg = err["msg"]
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, FieldProblem):
            loc, msg = (*loc, cause.field), str(cause)
            lines.append(f"{where(loc)}: {msg}")
            continue
        if err["type"] == "extra_forbidden":
            msg = unknown_key(loc[-1], _fields_at(cls, loc)) if loc else "not an option here"
        elif err["type"] == "missing":
            msg = "required"
        elif err["type"] in ("value_error", "assertion_error"):
            msg = msg.removeprefix("Value error, ").removeprefix("Assertion failed, ")
        if err["type"] not in ("missing", "extra_forbidden") and not isinstance(err.get("input"), (dict, list)):
            msg = f"{_shown(err.get('input'))}: {msg}"
        lines.append(f"{where(loc)}: {msg}")
    return lines


def fields_help(cls: type[BaseModel]) -> list[dict[str, Any]]:
    """``[{name, type, default, help}]`` of a settings class, in declaration order."""
    out = []
    for name, info in cls.model_fields.items():
        ann = info.annotation
        type_name = getattr(ann, "__name__", None) or str(ann).replace("typing.", "")
        default = None if info.is_required() else info.get_default(call_default_factory=True)
        out.append({"name": name, "type": type_name, "required": info.is_required(), "default": default,
                    "help": info.description or ""})
    return out
