"""Tests of the core's modules that mirror them one to one: ``test_scheduler.py`` for
``aioengine/scheduler.py``, ``test_loopqueue.py`` for ``loopqueue.py``, ``test_task.py``
for ``task.py``."""
