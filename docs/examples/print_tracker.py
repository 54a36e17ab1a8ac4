"""A minimal experiment tracker plugin: prints the training figures every ``every`` steps (and every evaluation).

The plugin guide shows this module as its tracker example; ``tests/testing/test_example_plugin.py`` registers it and
checks what it prints for a short run. A tracker receives each record ``modkit.train`` writes to ``metrics.jsonl``
(``log_metrics``); :func:`modkit.plugin.scalars` flattens one into ``{name: number}``.
"""

from typing import Literal

from modkit.plugin import Component, ComponentConfig, Tracker, hookimpl, scalars


class PrintConfig(ComponentConfig):
    type: Literal["print"] = "print"
    every: int = 10


class PrintTracker(Tracker):
    def __init__(self, cfg, setup):
        self.every, self.name = cfg.every, setup.name

    def log_metrics(self, record):
        if record["kind"] != "train" or record["step"] % self.every == 0:
            print(self.name, record["step"], scalars(record))


@hookimpl
def register_components(register):
    register(
        Component(
            kind="tracker",
            type="print",
            config=PrintConfig,
            factory=PrintTracker,
            description="prints the figures",
            capabilities={"flag_value": "every"},
        )
    )
