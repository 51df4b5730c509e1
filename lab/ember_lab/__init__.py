"""ember's lab: measurement, apart from the product. It imports ember's public names only, and
ember never imports it; `ember bench` and `ember plan` reach it through the "ember.commands" entry
points of lab/pyproject.toml.

Where each piece lives:
- bench/      `ember bench`: the platform comparison's rows, measurement, report and plots;
              commands.py holds the flags and handlers of `ember bench` and `ember plan`
- plan.py     `ember plan`: the throughput model's predictions as a table, and advice
- perfmodel/  the throughput model (DeepSpark's compute/communication trade-off)
- units.py    link rates, latencies and counts as `ember plan` and the bench read them
- emulated/   emulated hosts: network namespaces, tc link rates, a Spark standalone cluster
- ../benchmarks/  the micro-benchmarks, scripts run by path (their README says how)

imports: nothing of the lab
"""
