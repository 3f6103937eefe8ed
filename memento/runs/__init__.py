"""Runs: the processes that drive the M-MDP over time and write a run directory.

- :mod:`memento.runs.base`: the skeleton every run kind shares (:class:`~memento.runs.base.Run`: seeds, run
  directory, bank, policy, checkpoints and resume, TensorBoard, progress, summary; a kind writes ``_act`` and
  ``_commit``); a run's default policy config of each kind comes from the policy registry
  (:func:`memento.policies.loop_policy`, :func:`memento.policies.regret_policy`);
- :mod:`memento.runs.qa`: the online QA loop (one task, one LLM call per step);
- :mod:`memento.runs.games`: the multi-step loop on text games;
- :mod:`memento.runs.ray`: the QA loop with Ray rollout workers;
- :mod:`memento.runs.regret`: the regret run on a synthetic bandit;
- :mod:`memento.runs.compare`, :mod:`memento.runs.lifelong`: several runs side by side;
- :mod:`memento.runs.labels`: planner-scored labels, offline (``memento score``: the planner scores each
  task's candidate cases);
- :mod:`memento.runs.rundir`: the run directory and its checkpoints.
"""
