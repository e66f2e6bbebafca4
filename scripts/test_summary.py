"""Print the failed and errored tests of a pytest JUnit XML report, as the last lines of a test run.

``./dev.sh test`` runs this after pytest has exited, so the failures are the last thing printed even when a library
keeps writing to stderr while the interpreter shuts down (a Kafka client retrying a broker the tests have stopped, a
Py4J connection closing): a reader of the log's tail sees what failed, not that noise.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def summarize(report: Path, width: int = 400) -> tuple[list[str], dict[str, int]]:
    root = ET.parse(report).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    totals = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    lines = []
    for case in root.iter("testcase"):
        for kind in ("failure", "error"):
            bad = case.find(kind)
            if bad is None:
                continue
            name = f"{case.get('classname', '')}::{case.get('name', '')}".lstrip(":")
            message = " ".join((bad.get("message") or bad.text or "").split())
            if len(message) > width:
                message = message[: width - 1] + "…"
            lines.append(f"{kind.upper():7} {name}: {message}")
    return lines, totals


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: test_summary.py REPORT.xml", file=sys.stderr)
        return 2
    report = Path(argv[1])
    if not report.is_file():
        print(f"==> no test report at {report} (pytest stopped before writing it)")
        return 1
    try:
        lines, totals = summarize(report)
    except ET.ParseError as e:
        print(f"==> the test report {report} could not be read: {e}")
        return 1
    passed = totals["tests"] - totals["failures"] - totals["errors"] - totals["skipped"]
    print(
        f"==> test report: {passed} passed, {totals['failures']} failed, {totals['errors']} errors, "
        f"{totals['skipped']} skipped ({report})"
    )
    for line in lines:
        print(f"    {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
