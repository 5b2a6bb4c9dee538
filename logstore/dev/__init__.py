"""Development harnesses: real processes on loopback for tests, benchmarks and ``logstore dev cluster``.

* :mod:`.etcd_process` — an etcd server in a child process (the cluster's metadata store);
* :mod:`.local_cluster` — etcd and N brokers as child processes (``python -m logstore.broker``),
  with kill, pause, restart and link cuts;
* :mod:`.tcp_proxy` — a TCP proxy whose link can be reset or black-holed (fault injection).

Above the broker in the package map: they start brokers (as processes, not by import), and
nothing of the product imports them; only the CLI's ``dev`` verbs, the tests and the
benchmarks do.
"""
