"""Programs that tests run in subprocesses, as files that ruff and mypy check.

Run one as ``[sys.executable, str(SCRIPTS / "name.py"), *args]`` (``support.SCRIPTS``). Each
takes its inputs as command-line arguments and imports only what an installed ``rayform``
provides (plus ``support`` where a test puts ``tests/`` on ``PYTHONPATH``).
"""
