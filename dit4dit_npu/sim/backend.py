"""Start the simulator's dependencies, or explain in one line why they cannot start.

MuJoCo picks its OpenGL platform from ``MUJOCO_GL`` when ``mujoco`` is first imported, and a
wrong or missing platform fails deep inside PyOpenGL (``'NoneType' object has no attribute
'glGetError'``). Headless machines have two working choices: ``egl`` (libegl1 + libegl-mesa0,
llvmpipe on CPU, or the GPU's EGL) and ``osmesa`` (libosmesa6); both render the scenes at the
same speed on CPU. ``egl`` is the default here; an explicit ``MUJOCO_GL`` is always respected.

Load order matters in a process that also runs a policy: Mesa's software renderer (llvmpipe,
behind EGL and OSMesa on CPU) and Triton (imported by torch/diffusers where it is installed) each
carry their own LLVM, and ``import triton`` *after* Mesa has loaded crashes the process with a
segmentation fault in Triton's library initialisers. The other order is fine, so Triton, when
installed, is imported before the first OpenGL context.
"""

from __future__ import annotations

import importlib.util
import os
from types import ModuleType

from dit4dit_npu.sim.errors import SimError
from dit4dit_npu.sim.metaworld_tasks import INSTALL_HELP as METAWORLD_INSTALL_HELP

DEFAULT_GL = "egl"
GL_HELP = (
    "try MUJOCO_GL=egl (needs libegl1 and libegl-mesa0) or MUJOCO_GL=osmesa (needs libosmesa6, "
    "e.g. apt-get install libosmesa6)"
)
INSTALL_HELP = "install the simulation extra: pip install -e '.[sim]' (gym-aloha, mujoco, dm-control, metaworld)"


def gl_backend() -> str:
    """The OpenGL platform MuJoCo will use (the default is set if the user chose none)."""
    os.environ.setdefault("MUJOCO_GL", DEFAULT_GL)
    return os.environ["MUJOCO_GL"]


def _load_triton_before_mesa() -> None:
    if importlib.util.find_spec("triton") is not None:
        import triton  # noqa: F401  (see the module docstring: LLVM load order)


def import_mujoco() -> ModuleType:
    """``import mujoco`` under the chosen platform; a failure names the platform and the fix."""
    gl = gl_backend()
    _load_triton_before_mesa()
    try:
        import mujoco
    except ImportError as e:
        raise SimError(f"mujoco is not installed ({e}); {INSTALL_HELP}") from None
    except Exception as e:  # PyOpenGL raises AttributeError/RuntimeError for a missing platform
        raise SimError(
            f"MuJoCo cannot load OpenGL with MUJOCO_GL={gl} ({type(e).__name__}: {e}); {GL_HELP}"
        ) from None
    return mujoco


def import_metaworld() -> ModuleType:
    """``import metaworld`` after MuJoCo's platform is set; a failure is one line with the install
    command (metaworld 3.0.0 also imports ``packaging`` without declaring it: that one is named)."""
    import_mujoco()
    try:
        import metaworld
    except ImportError as e:
        what = "is not installed" if e.name == "metaworld" else "cannot be imported"
        raise SimError(f"metaworld {what} ({e}); {METAWORLD_INSTALL_HELP}") from None
    return metaworld


def require_simulator(simulator: str = "ALOHA") -> None:
    """Check once, before any work, that the simulator's package (gym-aloha, or ``metaworld`` for
    "Meta-World") imports and that an offscreen renderer starts."""
    mujoco = import_mujoco()
    if simulator == "Meta-World":
        import_metaworld()
    else:
        try:
            import dm_control.mujoco  # noqa: F401
            import gym_aloha.tasks.sim  # noqa: F401
        except ImportError as e:
            raise SimError(f"gym-aloha is not installed ({e}); {INSTALL_HELP}") from None
    model = mujoco.MjModel.from_xml_string("<mujoco><worldbody><geom size='.1'/></worldbody></mujoco>")
    try:
        renderer = mujoco.Renderer(model, 16, 16)
    except Exception as e:
        raise SimError(
            f"cannot start a MuJoCo renderer with MUJOCO_GL={gl_backend()} ({type(e).__name__}: {e}); {GL_HELP}"
        ) from None
    renderer.close()
