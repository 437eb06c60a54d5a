"""A page opened in a real headless Chromium, through the DevTools protocol over a pipe
(``--remote-debugging-pipe``: fd 3 in, fd 4 out, NUL-terminated JSON; no port, no
network): what the console and the log said, every request the page made, what its
images decoded to, and a screenshot of the whole page.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BINARIES = ("chromium", "chromium-browser", "google-chrome")


def find_chromium() -> str | None:
    return next((p for b in BINARIES if (p := shutil.which(b))), None)


@dataclass
class PageVisit:
    """What loading one page produced."""

    errors: list[str] = field(default_factory=list)  # console errors, exceptions, log errors
    requests: list[str] = field(default_factory=list)  # every URL the page asked for
    images: list[dict[str, Any]] = field(default_factory=list)  # complete, width, height
    screenshot: bytes = b""  # PNG of the whole page
    layout: dict[str, Any] = field(default_factory=dict)  # LAYOUT's answer, at load


class DevTools:
    """One Chromium process driven over its DevTools pipe."""

    def __init__(self, binary: str, timeout: float = 60.0) -> None:
        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix="ckptbench-chromium-")
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()

        def fds_3_and_4() -> None:  # in the child, before exec: Chromium's fixed fds
            a = fcntl.fcntl(to_chrome_r, fcntl.F_DUPFD_CLOEXEC, 10)
            b = fcntl.fcntl(from_chrome_w, fcntl.F_DUPFD_CLOEXEC, 10)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.proc = subprocess.Popen(
            [binary, "--headless", "--disable-gpu", "--no-sandbox", "--remote-debugging-pipe",
             f"--user-data-dir={self.profile}", "--no-first-run", "--hide-scrollbars",
             "--mute-audio", "--window-size=1280,1000", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            close_fds=False, preexec_fn=fds_3_and_4)  # noqa: PLW1509 (single-threaded test)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buf = b""
        self._next = 0
        self.events: list[dict[str, Any]] = []

    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_chrome], [], [], left)[0]:
                raise TimeoutError("chromium did not answer in time")
            chunk = os.read(self._from_chrome, 1 << 20)
            if not chunk:
                err = self.proc.stderr.read().decode(errors="replace")[-2000:] if self.proc.stderr else ""
                raise RuntimeError(f"chromium closed its DevTools pipe: {err}")
            self._buf += chunk
        raw, _, self._buf = self._buf.partition(b"\0")
        return json.loads(raw)

    def call(self, method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
        """Send one command and wait for its answer (events meanwhile are kept)."""
        self._next += 1
        msg: dict[str, Any] = {"id": self._next, "method": method, "params": params}
        if session:
            msg["sessionId"] = session
        os.write(self._to_chrome, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            m = self._read_message(deadline)
            if m.get("id") == self._next:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return m.get("result", {})
            self.events.append(m)

    def wait_for(self, method: str) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout
        for i, e in enumerate(self.events):
            if e.get("method") == method:
                return self.events.pop(i)
        while True:
            m = self._read_message(deadline)
            if m.get("method") == method:
                return m
            self.events.append(m)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.call("Browser.close")
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._to_chrome, self._from_chrome):
            with contextlib.suppress(OSError):
                os.close(fd)
        if self.proc.stderr:
            self.proc.stderr.close()
        shutil.rmtree(self.profile, ignore_errors=True)


def _errors(events: list[dict[str, Any]]) -> list[str]:
    out = []
    for e in events:
        method, p = e.get("method"), e.get("params", {})
        if method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            out.append("console: " + " ".join(str(a.get("value", a.get("description")))
                                              for a in p.get("args", [])))
        elif method == "Runtime.exceptionThrown":
            out.append("exception: " + str(p.get("exceptionDetails", {}).get("text")))
        elif method == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            out.append(f"log: {p['entry'].get('text')} {p['entry'].get('url', '')}".strip())
        elif method == "Network.loadingFailed" and not p.get("canceled"):
            out.append(f"network: {p.get('errorText')}")
    return out


# What sticks out at the window's width: the document's scroll width, and every visible
# element whose right edge is past the window or whose content is wider than its box
# (scrolled or clipped), named by tag, class and the start of its text.
LAYOUT = """(() => {
  const w = window.innerWidth, over = [];
  for (const el of document.querySelectorAll('body *')) {
    const r = el.getBoundingClientRect();
    if (!r.width) continue;
    if (r.right > w + 0.5 || el.scrollWidth > el.clientWidth + 1)
      over.push(`${el.tagName}.${el.className}: ${(el.textContent || '').slice(0, 60)}`);
  }
  return {width: w, scrollWidth: document.documentElement.scrollWidth, over: over.slice(0, 20)};
})()"""


def visit(path: Path, binary: str, width: int = 1280, max_height: int = 16000) -> PageVisit:
    """Open `path` (file://), wait for its load event, then read what it produced."""
    chrome = DevTools(binary)
    try:
        target = chrome.call("Target.createTarget", url="about:blank")["targetId"]
        s = chrome.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Runtime", "Log", "Page", "Network"):
            chrome.call(f"{domain}.enable", session=s)
        chrome.call("Emulation.setDeviceMetricsOverride", session=s, width=width, height=1000,
                    deviceScaleFactor=1, mobile=False)
        chrome.call("Page.navigate", session=s, url=path.resolve().as_uri())
        chrome.wait_for("Page.loadEventFired")
        images = chrome.call(
            "Runtime.evaluate", session=s, returnByValue=True,
            expression="Array.from(document.images).map(i => ({complete: i.complete, "
                       "width: i.naturalWidth, height: i.naturalHeight}))")["result"]["value"]
        layout = chrome.call("Runtime.evaluate", session=s, returnByValue=True,
                             expression=LAYOUT)["result"]["value"]
        height = chrome.call("Page.getLayoutMetrics", session=s)["cssContentSize"]["height"]
        chrome.call("Emulation.setDeviceMetricsOverride", session=s, width=width,
                    height=int(min(max(height, 100), max_height)), deviceScaleFactor=1, mobile=False)
        shot = chrome.call("Page.captureScreenshot", session=s, format="png")["data"]
        chrome.call("Runtime.evaluate", session=s, expression="0")  # drain late events
        events = chrome.events
        requests = [e["params"]["request"]["url"] for e in events
                    if e.get("method") == "Network.requestWillBeSent"]
        return PageVisit(_errors(events), requests, images, base64.b64decode(shot), layout)
    finally:
        chrome.close()
