"""What lerobot 0.6 finds the plugin by, checked without lerobot (which needs Python >= 3.12).

lerobot imports a plugin only if its distribution's name starts with ``lerobot_policy_``, and it
finds the policy class and the processor factory by naming convention from the registered config
class: ``<X>Config`` in ``configuration_<t>`` -> ``<X>Policy`` in ``modeling_<t>`` and
``make_<type>_pre_post_processors`` in ``processor_<t>``. A rename that breaks one of these breaks
``lerobot-eval`` only at run time, in the side environment; this reads the sources instead. The
plugin itself runs in tests/test_lerobot_plugin.py (interop tier).
"""

from __future__ import annotations

import ast
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: tomli, which pytest itself requires there
    import tomli as tomllib

PLUGIN = Path(__file__).resolve().parents[1] / "lerobot_plugin"
PACKAGE = PLUGIN / "lerobot_policy_dit4dit"


def tree(name: str) -> ast.Module:
    return ast.parse((PACKAGE / f"{name}.py").read_text())


def registered_configs(module: ast.Module) -> dict[str, str]:
    """{class name: the type it registers} for ``@PreTrainedConfig.register_subclass(TYPE)`` classes."""
    constants = {t.id: n.value.value for n in module.body if isinstance(n, ast.Assign)
                 for t in n.targets if isinstance(t, ast.Name) and isinstance(n.value, ast.Constant)}
    out = {}
    for node in module.body:
        if isinstance(node, ast.ClassDef):
            for dec in node.decorator_list:
                if isinstance(dec, ast.Call) and getattr(dec.func, "attr", "") == "register_subclass":
                    arg = dec.args[0]
                    out[node.name] = arg.value if isinstance(arg, ast.Constant) else constants[arg.id]
    return out


def test_lerobot_finds_the_plugin_by_its_names() -> None:
    project = tomllib.loads((PLUGIN / "pyproject.toml").read_text())["project"]
    assert project["name"].startswith("lerobot_policy_") and project["name"] == PACKAGE.name
    configs = registered_configs(tree("configuration_dit4dit"))
    assert configs == {"DiT4DiTConfig": "dit4dit"}
    classes = {n.name for n in tree("modeling_dit4dit").body if isinstance(n, ast.ClassDef)}
    assert "DiT4DiTPolicy" in classes
    functions = {n.name for n in tree("processor_dit4dit").body if isinstance(n, ast.FunctionDef)}
    assert "make_dit4dit_pre_post_processors" in functions
    script = project["scripts"]["dit4dit-lerobot-prepare"]
    module, func = script.split(":")
    assert func in {n.name for n in tree(module.split(".")[-1]).body if isinstance(n, ast.FunctionDef)}
