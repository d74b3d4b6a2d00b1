"""Runs one page's Python examples in order in this interpreter, like notebook cells.

Usage: ``python tests/support/scripts/docrunner.py BLOCKS.json``, where the file holds
``[{"where": "docs/x.md:12", "code": "..."}]``. Blocks share one namespace. A block with
``>>> `` lines runs as a doctest (ELLIPSIS, NORMALIZE_WHITESPACE). Exits 1 at the first
failing block, after printing where it is and why.
"""

from __future__ import annotations

import doctest
import json
import sys
import traceback


def main(path: str) -> int:
    with open(path, encoding="utf-8") as f:
        blocks = json.load(f)
    namespace: dict[str, object] = {"__name__": "__main__"}
    for block in blocks:
        where, code = block["where"], block["code"]
        print(f"--- {where}", flush=True)
        if any(line.startswith(">>> ") for line in code.splitlines()):
            test = doctest.DocTestParser().get_doctest(code, namespace, where, where, 0)
            runner = doctest.DocTestRunner(
                optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
            )
            result = runner.run(test, out=sys.stdout.write, clear_globs=False)
            namespace.update(test.globs)
            if result.failed:
                print(f"FAILED: {where}: {result.failed} doctest example(s) differ", flush=True)
                return 1
            continue
        try:
            exec(compile(code, where, "exec"), namespace)  # noqa: S102 - running the docs is the point
        except BaseException:
            traceback.print_exc()
            print(f"FAILED: {where}", flush=True)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
