"""Tests of the core's modules that mirror them one to one: ``test_scheduler.py`` for
``aioengine/scheduler.py``, ``test_corestate.py`` for ``corestate.py`` (the scheduler's
state), ``test_routing.py``, ``test_wakeups.py``, ``test_cancellation.py``,
``test_loopqueue.py``, ``test_task.py`` and ``test_failures.py`` for the modules of the same
names."""
