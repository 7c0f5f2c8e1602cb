"""The sweep studies (``studies.<name>`` but the ESSA study): their run configurations, named
``es_sigma<value>`` and ``grpo_beta<value>`` (``_lr<value>`` with a learning-rate sweep; an ES run's alpha follows
its sigma with ``alpha_over_sigma``), their runs, and the settings layers of a study's run."""

from __future__ import annotations

from esrepro.pipeline.names import SWEEPS, StudyMethod, format_value
from esrepro.settings.layers import ConfigError, Layer, at
from esrepro.settings.methods import algorithm
from esrepro.settings.pipeline import Study


class StudiesMixin:
    """:class:`~esrepro.pipeline.Pipeline`'s sweep studies (``self.cfg.studies``)."""

    def studies(self) -> dict[str, Study]:
        """The sweep studies this config runs, by name (ES sigmas, GRPO betas and learning rates; the conciseness
        studies); the ESSA study is apart (:meth:`essa_study`)."""
        return {k: v for k, v in self.cfg.studies if isinstance(v, Study)}

    def study_methods(self, name: str) -> dict[str, StudyMethod]:
        """A study's run configurations by method name: one per swept value per algorithm."""
        import numpy as np

        study = self.studies()[name]
        out: dict[str, StudyMethod] = {}
        for algo, (key, setting, prefix) in SWEEPS.items():
            sweep = getattr(study, algo)
            if sweep is None:
                continue
            spaced = getattr(sweep, f"{key}_logspace", None)
            values = ([float(v) for v in np.logspace(spaced.start, spaced.stop, spaced.num)] if spaced
                      else [float(v) for v in getattr(sweep, key)])
            rates = getattr(sweep, "learning_rates", None) or [None]
            for value in values:
                for lr in rates:
                    method = f"{prefix}{format_value(value)}" + ("" if lr is None else f"_lr{format_value(lr)}")
                    swept = {setting: value, **({} if lr is None else {"learning_rate": float(lr)})}
                    ratio = getattr(sweep, "alpha_over_sigma", None)
                    if ratio is not None:  # ES's alpha follows its sigma (v2 App. A.2: alpha = sigma/2)
                        swept["alpha"] = float(ratio) * value
                    if method in out:
                        raise ConfigError(at(self.source, "studies", name, algo) + f": values {out[method].swept} "
                                          f"and {swept} share the method name {method}")
                    out[method] = StudyMethod(name, algo, swept)
        return out

    def study_runs(self, name: str) -> list[tuple[str, str, int]]:
        """(model, method, seed) of a study's training runs."""
        study = self.studies().get(name)
        if study is None:
            return []
        return [(model, m, s) for model in study.models for m in self.study_methods(name) for s in study.seeds]

    def _study_layers(self, model: str, method: str, found: StudyMethod) -> list[Layer]:
        study = self.studies()[found.study]
        sweep = getattr(study, found.algorithm)
        family = algorithm(found.algorithm).defaults
        return [
            Layer(self.source, f"defaults.{family}", dict(getattr(self.cfg.defaults, family))),
            Layer(self.source, f"studies.{found.study}.{found.algorithm}.settings", dict(sweep.settings)),
            self._registry_layer(model, found.algorithm),
            Layer(self.source, f"studies.{found.study}", {**found.swept, "algorithm": found.algorithm,
                                                          "keep_every": study.keep_every}),
        ]
