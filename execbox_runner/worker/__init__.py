"""The worker side: the zygote, the confined worker processes and the guest runtime.

Guest JavaScript runs only here, in QuickJS, after ``sandbox`` has confined
the process. Nothing here imports the daemon.
"""
