"""The recipe's run: plan (recipe -> step graph), the runner and its one commit path, the
pipeline that runs and records steps, the report of a run."""
