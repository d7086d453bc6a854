"""attnserve-bench --html in a real browser: a short ramp against a live server is drawn as HTML,
redrawn from its JSON with --html_from (the same bytes), then loaded in headless Chromium, which
must report nothing on its console and find every chart's SVG drawn with a non-empty box.

The page, its JSON, the DOM Chromium saw and a screenshot stay in $ARTIFACTS_DIR (under the build
folder) for whoever wants to look.

Exit: 0 ok, 1 a check failed, 77 (ctest's SKIP_RETURN_CODE) only when Chromium is not installed
or cannot start here at all (the reason is printed).
"""
import html
import html.parser
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from live_server import LiveServer  # noqa: E402

BENCH = os.environ["ATTNSERVE_BENCH"]
ARTIFACTS = os.environ["ARTIFACTS_DIR"]
WINDOW = (1100, 4000)

# Injected into a copy of the page (the report itself runs no script): records uncaught errors
# from the start, and at the end of the body measures every chart and leaves the result on
# <body data-check="...">, which --dump-dom prints.
HEAD_PROBE = """<script>window.__errors = [];
window.addEventListener("error", function (e) { window.__errors.push(String(e.message)); });
</script>"""
BODY_PROBE = """<script>(function () {
  var charts = [];
  document.querySelectorAll("svg.chart").forEach(function (svg) {
    var box = svg.getBBox(), rect = svg.getBoundingClientRect(), drawn = 0;
    svg.querySelectorAll(".data circle, .data rect").forEach(function (mark) {
      var b = mark.getBBox();
      if (b.width > 0 && b.height > 0) drawn++;
    });
    charts.push({label: svg.getAttribute("aria-label"), elements: svg.querySelectorAll("*").length,
                 marks: drawn, empty: svg.textContent.indexOf("no data") >= 0,
                 bbox: [box.width, box.height], rect: [rect.width, rect.height]});
  });
  document.body.setAttribute("data-check", JSON.stringify({charts: charts,
                                                           errors: window.__errors}));
})();</script>"""


def skip(reason):
    print(f"SKIP: {reason}")
    sys.exit(77)


def chromium_command():
    exe = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not exe:
        skip("chromium is not installed (scripts/install-deps.sh installs Debian's chromium)")
    return exe


def run_chromium(exe, profile, *args):
    # --no-sandbox: CI containers run as root, where Chromium's sandbox refuses to start. The page
    # is our own local file. --enable-logging=stderr --v=0 prints console messages as
    # "...:CONSOLE:<line>] "message", source: ...".
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
           "--disable-extensions", f"--user-data-dir={profile}", "--enable-logging=stderr",
           "--v=0", "--hide-scrollbars", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def console_lines(stderr):
    return [l for l in stderr.splitlines() if ":CONSOLE" in l]


def probe(exe, profile):
    """Skips unless Chromium can load a trivial page and give its DOM back."""
    try:
        p = run_chromium(exe, profile, "--dump-dom", "data:text/html,<p id=probe>alive</p>")
    except (OSError, subprocess.TimeoutExpired) as e:
        skip(f"chromium cannot run here: {e}")
    if p.returncode != 0 or "alive" not in p.stdout:
        skip(f"chromium cannot run here (exit {p.returncode}): {p.stderr.strip()[-2000:]}")


class Svgs(html.parser.HTMLParser):
    """Counts <svg class="chart"> elements, the elements inside each, and outside references."""

    def __init__(self):
        super().__init__()
        self.charts = []  # [label, element count]
        self.depth = 0
        self.references = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        for name in ("src", "href", "xlink:href"):
            if name in a:
                self.references.append((tag, name, a[name]))
        if tag == "link":
            self.references.append((tag, "link", a))
        if tag == "svg" and "chart" in a.get("class", "").split():
            self.charts.append([a.get("aria-label"), 0])
            self.depth = 1
        elif self.depth > 0:
            self.charts[-1][1] += 1
            self.depth += 1

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        self.handle_endtag(tag)

    def handle_endtag(self, tag):
        if self.depth > 0:
            self.depth -= 1


def png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    if head[:8] != b"\x89PNG\r\n\x1a\n":
        raise AssertionError(f"{path} is not a PNG")
    return struct.unpack(">II", head[16:24])


def check(condition, message):
    if not condition:
        print(f"FAIL: {message}")
        sys.exit(1)


def main():
    exe = chromium_command()
    os.makedirs(ARTIFACTS, exist_ok=True)
    run_json = os.path.join(ARTIFACTS, "run.json")
    run_html = os.path.join(ARTIFACTS, "run.html")
    redrawn = os.path.join(ARTIFACTS, "redrawn.html")
    checked = os.path.join(ARTIFACTS, "run-with-probe.html")
    shot = os.path.join(ARTIFACTS, "run.png")
    for f in (run_json, run_html, redrawn, checked, shot):
        if os.path.exists(f):
            os.remove(f)

    with tempfile.TemporaryDirectory() as profile:
        probe(exe, profile)

        server = LiveServer()
        try:
            p = subprocess.run(
                [BENCH, f"--target={server.target}", "--mode=open", "--ramp=40:120:3",
                 "--duration_s=1.5", "--warmup_s=0.3", "--shapes=1,2,32,16", "--progress=off",
                 f"--json={run_json}", f"--html={run_html}"],
                capture_output=True, text=True, timeout=300)
        finally:
            server.stop()
        check(p.returncode == 0, f"attnserve-bench exited {p.returncode}: {p.stderr}{p.stdout}")
        with open(run_json) as f:
            report = json.load(f)
        phases = report["phases"]
        check(len(phases) == 3, f"3 phases expected: {[ph['name'] for ph in phases]}")
        for ph in phases:
            check(sum(ph["latency_histogram"]["counts"]) == ph["sent"],
                  f"{ph['name']}: histogram counts {ph['latency_histogram']} != sent {ph['sent']}")
            check(sum(ph["series"]["sent"]) == ph["sent"] and
                  sum(ph["series"]["ok"]) == ph["ok"], f"{ph['name']}: series {ph['series']}")
            # Seconds counted from the first phase's start; the buckets tile the phase.
            series = ph["series"]
            check(abs(series["t_s"][0] - ph["start_s"]) < 1e-3 and
                  abs(sum(series["width_s"]) - ph["elapsed_s"]) < 1e-3,
                  f"{ph['name']}: buckets {series['t_s']} {series['width_s']} do not tile "
                  f"[{ph['start_s']}, +{ph['elapsed_s']}]")
        check(phases[0]["start_s"] == 0 and
              phases[1]["start_s"] >= phases[0]["start_s"] + phases[0]["elapsed_s"] - 1e-3,
              f"phase starts {[ph['start_s'] for ph in phases]}")
        check(report["config"]["levels"] == [ph["level"] for ph in phases], report["config"])
        check(report["server"]["batching"]["max_batch_requests"] > 0, report["server"])
        check(report["machine"]["logical_cores"] >= 1, report["machine"])

        # The page is drawn from the JSON: a redraw of the saved file gives the same bytes.
        p = subprocess.run([BENCH, f"--html_from={run_json}", f"--html={redrawn}"],
                           capture_output=True, text=True, timeout=60)
        check(p.returncode == 0, f"--html_from exited {p.returncode}: {p.stderr}")
        with open(run_html, encoding="utf-8") as f:
            page = f.read()
        with open(redrawn, encoding="utf-8") as f:
            check(f.read() == page, "--html_from drew a different page from the saved JSON")

        # Self-contained: no reference to anything outside the file.
        parsed = Svgs()
        parsed.feed(page)
        check(parsed.references == [], f"outside references: {parsed.references}")
        check(not re.search(r"https?:|//[a-z]", page.split('id="attnserve-bench-data"')[0]),
              "the page names a URL")
        expected = 2 + len(phases) + 2  # knee, split, a histogram per phase, rates, p99
        check(len(parsed.charts) == expected,
              f"{expected} charts expected, found {[c[0] for c in parsed.charts]}")
        for label, elements in parsed.charts:
            check(elements >= 10, f"chart '{label}' has only {elements} elements")

        # Screenshot, with the console watched.
        url = "file://" + os.path.abspath(run_html)
        p = run_chromium(exe, profile, f"--screenshot={shot}",
                         f"--window-size={WINDOW[0]},{WINDOW[1]}", url)
        check(p.returncode == 0, f"chromium --screenshot exited {p.returncode}: {p.stderr[-3000:]}")
        check(console_lines(p.stderr) == [], f"console messages: {console_lines(p.stderr)}")
        check(os.path.exists(shot), f"no screenshot written: {p.stderr[-3000:]}")
        check(png_size(shot) == WINDOW, f"screenshot is {png_size(shot)}, not {WINDOW}")
        check(os.path.getsize(shot) > 50_000, f"screenshot of {os.path.getsize(shot)} bytes")

        # The DOM Chromium built, measured by the probe script in a copy of the page.
        probed = page.replace("<head>", "<head>" + HEAD_PROBE, 1).replace(
            "</body>", BODY_PROBE + "</body>", 1)
        with open(checked, "w", encoding="utf-8") as f:
            f.write(probed)
        p = run_chromium(exe, profile, "--dump-dom",
                         f"--window-size={WINDOW[0]},{WINDOW[1]}",
                         "file://" + os.path.abspath(checked))
        check(p.returncode == 0, f"chromium --dump-dom exited {p.returncode}: {p.stderr[-3000:]}")
        check(console_lines(p.stderr) == [], f"console messages: {console_lines(p.stderr)}")
        with open(os.path.join(ARTIFACTS, "dom.html"), "w", encoding="utf-8") as f:
            f.write(p.stdout)
        m = re.search(r'<body[^>]*data-check="([^"]*)"', p.stdout)
        check(m is not None, "the probe script left no result on <body> (did it run?)")
        result = json.loads(html.unescape(m.group(1)))
        check(result["errors"] == [], f"page errors: {result['errors']}")
        check(len(result["charts"]) == expected, f"Chromium found {len(result['charts'])} charts")
        for c in result["charts"]:
            check(c["elements"] >= 10 and min(c["bbox"]) > 50 and min(c["rect"]) > 100,
                  f"chart drawn tiny: {c}")
            # Data drawn: points or bars with a visible box, and no "no data" placeholder.
            check(c["marks"] > 0 and not c["empty"], f"chart without data: {c}")
        knee = result["charts"][0]
        check(knee["marks"] == 4 * len(phases), f"knee: 4 percentiles x {len(phases)} phases: {knee}")
        buckets = sum(len(ph["series"]["t_s"]) for ph in phases)
        rates = result["charts"][-2]
        check(rates["marks"] == 3 * buckets, f"rates: sent, OK, errors x {buckets} seconds: {rates}")
    print(f"ok: {expected} charts drawn, console clean; screenshot {shot}")


if __name__ == "__main__":
    main()
