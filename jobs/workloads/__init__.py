"""Built-in workloads. Each runs on its own: `python -m jobs.workloads.<name> --steps N --seed S`.

This package runs on the instance and never imports Django.
"""
