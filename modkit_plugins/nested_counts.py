"""The parameter count of a component nested in another one's config (a hybrid's mixers, a side block's parts, a
mixture's experts and router), for the outer component's ``param_count`` declaration.

Source: the contract of :class:`modkit.core.registry.Component` (``param_count(cfg, ctx)`` equals the parameters of
``factory(cfg, ctx)``), which the contract kit's ``param_count`` check holds every declaration to.
"""

from __future__ import annotations

import torch

from modkit.plugin import BuildContext, ComponentConfig


def nested_param_count(config: ComponentConfig, ctx: BuildContext) -> int:
    """Parameters of the component ``config`` built in ``ctx``: its entry's declared ``param_count``, or else the
    module built on the meta device (no memory, no initialisation) and counted.

    Raises:
        RegistryError: ``config``'s type is not registered (from ``ctx.registry``).
    """
    entry = ctx.registry.entry_for_config(config)
    if entry.param_count is not None:
        return int(entry.param_count(config, ctx))
    with torch.device("meta"):
        return sum(p.numel() for p in ctx.build(config).parameters())
