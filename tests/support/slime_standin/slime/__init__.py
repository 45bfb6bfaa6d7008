"""Test-only stand-in for slime (THUDM/slime), which is not on PyPI: NOT slime.

It copies, from slime 0.3.1 at commit 624b824a898ab0ec1fcb4d373004c7f3852bf515 (2026-08-21), exactly what
``polar_cli.trainers.slime_rollout`` touches and nothing more:

- ``slime.utils.types.Sample``: its fields and ``Sample.Status`` (the tensor-typed fields typed loosely, no torch);
- ``slime.rollout.base_types``: ``RolloutFnTrainOutput``, ``RolloutFnEvalOutput`` and ``call_rollout_fn``, the way
  slime's ``RolloutManager`` calls a ``--rollout-function-path`` / ``--eval-function-path`` function;
- ``slime.rollout.data_source``: ``RolloutDataSourceWithBuffer``'s ``get_samples`` / ``add_samples`` /
  ``get_buffer_length`` and ``pop_first`` (its partial-rollout buffer), over a list of prompt samples instead of
  slime's tokenizing ``Dataset`` (the rows, in order, no shuffle).

The tests put its folder on ``sys.path``.
"""
