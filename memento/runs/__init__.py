"""Runs: the processes that drive the M-MDP over time and write a run directory.

- :mod:`memento.runs.qa`: the online QA loop (one task, one LLM call per step);
- :mod:`memento.runs.games`: the multi-step loop on text games;
- :mod:`memento.runs.ray`: the QA loop with Ray rollout workers;
- :mod:`memento.runs.regret`: the regret run on a synthetic bandit;
- :mod:`memento.runs.compare`, :mod:`memento.runs.lifelong`: several runs side by side;
- :mod:`memento.runs.rundir`: the run directory and its checkpoints.
"""
