"""Prints one closing line over every test run: meson's Criterion suites and pytest."""
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def meson_counts(build_dir):
    log = Path(build_dir) / "meson-logs" / "testlog.json"
    passed = failed = 0
    if log.exists():
        for line in log.read_text().splitlines():
            result = json.loads(line).get("result")
            if result in ("OK", "SKIP", "EXPECTEDFAIL"):
                passed += 1
            else:
                failed += 1
    return passed, failed


def pytest_counts(xml_path):
    path = Path(xml_path)
    if not path.exists():
        return 0, 1
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    total = sum(int(s.get("tests", 0)) for s in suites)
    bad = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
    skipped = sum(int(s.get("skipped", 0)) for s in suites)
    return total - bad - skipped, bad


*builds, xml_path = sys.argv[1:]
passed = failed = 0
for b in builds:
    p, f = meson_counts(b)
    passed, failed = passed + p, failed + f
p, f = pytest_counts(xml_path)
print(f"{passed + p} passed, {failed + f} failed")
