"""Every interpreter started with tests/inject on PYTHONPATH (the whole suite's, and the processes
reprotune starts from it) puts in place the faults its environment asks for (injected_faults)."""

import injected_faults

injected_faults.install_from_env()
