"""Runs the examples of a README exactly as written, against a live attnserve, so that what a
reader copies is what CI ran.

An example is a fenced block right after a line `<!-- tested example: NAME -->`. They run in
order in a fresh sandbox folder holding copies of the repository folders named by --copy:
- sh blocks with bash (errexit, pipefail), Debian's /usr/bin first on PATH, pip offline
  (PIP_NO_INDEX=1, no build isolation: Debian's setuptools) and npm preferring its cache;
- python blocks with the sandbox's venv/bin/python (made by an sh block before them);
- js blocks with node, as a file in the sandbox (so require() finds sandbox/node_modules).
In every block the address "localhost:50051" is replaced by the live server's; nothing else is
changed. --expect NAME=TEXT requires the example NAME and TEXT in its output; an example
without an --expect, or an --expect without its example, fails the run; a --readme given as
PATH:P considers only the examples of PATH whose names start with P (a README's section for one
language). Several --readme run against one server, each in a sandbox of its own (WORK/1, ...),
in the order given: one test per language covers its package's README and the top one's section.

    readme_examples.py --readme client/python/README.md --readme README.md:python- \
        --copy client/python --expect NAME=TEXT WORK
Environment: ATTNSERVE_BIN (the server binary). Exits 77 (skipped) for js examples without node.

    readme_examples.py --readme README.md --quotes
checks instead the blocks after a line `<!-- quoted example: PATH -->` (code that another test
builds and runs, e.g. a C++ program): their lines, less indentation, must appear in that order
and consecutively in PATH; a line `// ...` or `# ...` in the block skips ahead in the file.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from live_server import LiveServer  # noqa: E402

MARKER = re.compile(r"^<!-- tested example: ([\w.-]+) -->\n```(\w+)\n(.*?)^```$",
                    re.MULTILINE | re.DOTALL)
QUOTED = re.compile(r"^<!-- quoted example: ([\w./-]+) -->\n```\w*\n(.*?)^```$",
                    re.MULTILINE | re.DOTALL)
ELISION = ("// ...", "# ...")
LEFT_BEHIND = shutil.ignore_patterns("build", "dist", "*.egg-info", "node_modules",
                                     "__pycache__", "*.tgz")


def examples(readme):
    """[(name, language, text)] in the order of the README."""
    with open(readme) as f:
        text = f.read()
    found = [(m.group(1), m.group(2), m.group(3)) for m in MARKER.finditer(text)]
    if text.count("<!-- tested example:") != len(found):
        raise SystemExit(f"{readme}: a '<!-- tested example: NAME -->' line is not followed by a "
                         "fenced block")
    return found


def check_quotes(readme):
    """0 when every quoted example appears in its file, else 1 (with what is missing)."""
    with open(readme) as f:
        text = f.read()
    quotes = QUOTED.findall(text)
    if text.count("<!-- quoted example:") != len(quotes) or not quotes:
        print(f"{readme}: no quoted example, or a marker without a fenced block after it")
        return 1
    status = 0
    for path, block in quotes:
        with open(os.path.join(ROOT, path)) as f:
            source = [line.strip() for line in f.read().splitlines()]
        chunks, chunk = [], []
        for line in block.splitlines():
            if line.strip() in ELISION:
                chunks.append(chunk)
                chunk = []
            else:
                chunk.append(line.strip())
        chunks.append(chunk)
        at = 0
        for chunk in filter(None, chunks):
            found = next((i for i in range(at, len(source) - len(chunk) + 1)
                          if source[i:i + len(chunk)] == chunk), None)
            if found is None:
                print(f"{readme}: these lines are not in {path} (after line {at}):\n  " +
                      "\n  ".join(chunk))
                status = 1
                break
            at = found + len(chunk)
        else:
            print(f"{readme}: the example quoted from {path} is in it")
    return status


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--readme", action="append", required=True,
                        help="PATH or PATH:PREFIX; repeatable")
    parser.add_argument("--copy", action="append", default=[])
    parser.add_argument("--expect", action="append", default=[])
    parser.add_argument("--quotes", action="store_true", help="check the quoted examples")
    parser.add_argument("work", nargs="?")
    args = parser.parse_args()
    if args.quotes:
        return max(check_quotes(os.path.join(ROOT, r)) for r in args.readme)
    expect = dict(e.split("=", 1) for e in args.expect)
    runs = []  # (sandbox, examples)
    for i, spec in enumerate(args.readme, 1):
        path, _, prefix = spec.partition(":")
        runs.append((os.path.join(os.path.abspath(args.work), str(i)),
                     [e for e in examples(os.path.join(ROOT, path)) if e[0].startswith(prefix)]))
    names = [n for _, found in runs for n, _, _ in found]
    if sorted(names) != sorted(expect):
        raise SystemExit(f"{args.readme}: examples {names}, expected {sorted(expect)}")

    if any(language == "js" for _, found in runs for _, language, _ in found) and not (
            shutil.which("node") and shutil.which("npm")):
        print("node or npm not installed: skipped")
        return 77
    shutil.rmtree(os.path.abspath(args.work), ignore_errors=True)
    for sandbox, _ in runs:
        os.makedirs(sandbox)
        for rel in args.copy:
            shutil.copytree(os.path.join(ROOT, rel), os.path.join(sandbox, rel),
                            ignore=LEFT_BEHIND)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTHON", "PIP_", "VIRTUAL_ENV", "NODE_PATH"))}
    env.update(PATH="/usr/bin:/bin:" + env.get("PATH", ""), PIP_NO_INDEX="1",
               PIP_NO_BUILD_ISOLATION="0",  # pip reads "0" here as --no-build-isolation
               PIP_DISABLE_PIP_VERSION_CHECK="1", npm_config_audit="false",
               npm_config_fund="false", npm_config_prefer_offline="true",
               npm_config_update_notifier="false", npm_config_loglevel="error")

    server = LiveServer()
    failed = False
    try:
        for sandbox, name, language, text in ((sandbox, *e) for sandbox, found in runs
                                              for e in found):
            if failed:
                break
            text = text.replace("localhost:50051", server.target)
            if language == "sh":
                command = ["bash", "-euo", "pipefail", "-c", text]
            elif language == "python":
                command = [os.path.join(sandbox, "venv", "bin", "python"), "-c", text]
            elif language == "js":
                path = os.path.join(sandbox, f"example-{name}.js")
                with open(path, "w") as f:
                    f.write(text)
                command = ["node", path]
            else:
                raise SystemExit(f"{name}: no way to run a {language} block")
            r = subprocess.run(command, cwd=sandbox, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, timeout=600)
            ok = r.returncode == 0 and expect[name] in r.stdout
            print(f"--- {name} ({language}): exit {r.returncode}, "
                  f"{'ok' if ok else 'FAILED, expected ' + repr(expect[name])}\n{r.stdout}")
            failed = not ok
    finally:
        server.stop()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
