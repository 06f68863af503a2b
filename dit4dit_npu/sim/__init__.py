"""Closed-loop simulation on gym-aloha's ALOHA scenes and Meta-World's (optional extra: ``pip install -e '.[sim]'``).

    tasks.py         task registry (scene file, instruction, seeded object poses), sizes; every
                     --task's SceneSpec (cameras, state/action sizes, rate, limits)
    metaworld_tasks.py  Meta-World's tasks and lerobot's facts about them (light: no metaworld import)
    metaworld_scene.py  MetaworldScene: the metaworld package's env as lerobot 0.6.1's env shows it
    backend.py       MUJOCO_GL choice and one-line errors when MuJoCo/OpenGL cannot start
    render.py        one offscreen renderer, shadows and MSAA off
    scene.py         AlohaScene: reset(seed) / step(action) with the project's observation keys
    ik.py            TCP-pose inverse kinematics for the two arms
    experts.py       scripted experts (transfer cube, insertion)
    policies.py      what the eval drives: expert, hold, a policy folder, a websocket server
    rollout.py       one episode, and the worker loop that runs many
    success_rate.py  Wilson interval and the summary line
    demos.py         python -m dit4dit_npu.sim.demos: expert demos -> LeRobot dataset
    eval.py          python -m dit4dit_npu.sim.eval: success rate with CIs, results.json, videos
    cli.py           those two commands' flags (demos_main, eval_main: dit4dit-sim-demos, dit4dit-sim-eval)

Importing this package is light; MuJoCo loads with ``scene``/``render``/``ik``, metaworld when a
``MetaworldScene`` is made.
"""
