"""Emulated hosts on one machine (network namespaces, tc link rates, a Spark standalone cluster
over them), for the multi-host tests, `lab/benchmarks/cluster.py` and `ember bench --hosts`.

netns.py builds the hosts and tears them down, on system.py's ip/tc commands, namespaces and
processes; standalone.py starts Spark on them, links.py measures a link with a bulk TCP
transfer (tcp_transfer.py, run by path in the hosts). Nothing here imports pyspark or zmq.

imports: nothing of the lab; nothing of ember either
"""
