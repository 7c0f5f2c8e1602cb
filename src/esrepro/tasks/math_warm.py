"""Importing this module warms math-verify in the importing process.

The grading pool's forkserver preloads it (``esrepro.tasks.math.GRADER_PRELOAD``):
sympy's lazy imports and math-verify's parser set-up (about 0.3 s) then happen once
in the server, and every grading worker forked from it starts warm. Import it
nowhere else.
"""

from __future__ import annotations

from esrepro.tasks.math import warm_math_verify

warm_math_verify()
