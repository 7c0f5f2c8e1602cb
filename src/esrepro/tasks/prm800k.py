"""PRM800K: the MATH problems of PRM800K's splits, as ESSA (Korotyshova et al.) aligns on them.

Prompt and grading are MATH's (:class:`~esrepro.tasks.math.MathTask`: the Qwen2.5-Math prompt,
the last ``\\boxed{}``, string and number checks, then math-verify; reward 1.0 if correct else
0.0); the data are :mod:`esrepro.tasks.prm800k_data`.
"""

from __future__ import annotations

from typing import ClassVar

from esrepro.tasks.math import MathTask


class PRM800KTask(MathTask):
    """PRM800K's MATH problems graded like MATH (options as :class:`~esrepro.tasks.math.MathTask`)."""

    name: ClassVar[str] = "prm800k"
    data_module: ClassVar[str | None] = "esrepro.tasks.prm800k_data"
