"""A real browser for tests/it/console.rs: Debian's chromium, headless, driven through
chromium-driver by Selenium. Reads one JSON command a line on stdin and answers one JSON line
on stdout ({"ok": true, ...} or {"ok": false, "error": ...}), so the Rust test can change the
daemon between browser steps.

Commands (`op`): open, login, text, exists, click, type, wait_text, wait_gone, js, js_async,
cookies, alert, screenshot, quit. AGENTD_BASE is the daemon's base URL.
"""

import json
import os
import sys
import time

from selenium import webdriver
from selenium.common.exceptions import NoAlertPresentException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

BASE = os.environ["AGENTD_BASE"]


def browser():
    opts = webdriver.ChromeOptions()
    opts.binary_location = os.environ.get("CHROMIUM", "/usr/bin/chromium")
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
              "--window-size=1280,900", "--hide-scrollbars", "--force-device-scale-factor=1"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver"))
    d = webdriver.Chrome(options=opts, service=service)
    d.set_page_load_timeout(60)
    d.set_script_timeout(60)
    return d


def body_text(d):
    return d.find_element(By.TAG_NAME, "body").text


def wait(pred, timeout):
    end = time.time() + timeout
    while time.time() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.1)
    return pred()


def run(d, c):
    op = c["op"]
    if op == "open":
        d.get(BASE + c["path"])
        return {"url": d.current_url, "title": d.title, "text": body_text(d)}
    if op == "login":
        d.get(BASE + "/console/login")
        box = d.find_element(By.ID, "token")
        box.clear()
        box.send_keys(c["token"])
        d.find_element(By.CSS_SELECTOR, "form.login button").click()
        wait(lambda: d.execute_script("return document.readyState") == "complete", 30)
        return {"url": d.current_url, "title": d.title, "text": body_text(d)}
    if op == "text":
        return {"text": d.find_element(By.CSS_SELECTOR, c["css"]).text}
    if op == "exists":
        return {"exists": len(d.find_elements(By.CSS_SELECTOR, c["css"])) > 0}
    if op == "click":
        d.find_element(By.CSS_SELECTOR, c["css"]).click()
        wait(lambda: d.execute_script("return document.readyState") == "complete", 30)
        return {"url": d.current_url, "text": body_text(d)}
    if op == "type":
        e = d.find_element(By.CSS_SELECTOR, c["css"])
        e.clear()
        e.send_keys(c["text"])
        return {}
    if op == "wait_text":
        css, want = c["css"], c["contains"]
        def found():
            els = d.find_elements(By.CSS_SELECTOR, css)
            return els and want in els[0].text
        ok = bool(wait(found, c.get("timeout", 60)))
        els = d.find_elements(By.CSS_SELECTOR, css)
        return {"found": ok, "text": els[0].text if els else ""}
    if op == "js":
        return {"value": d.execute_script(c["script"])}
    if op == "js_async":
        return {"value": d.execute_async_script(c["script"])}
    if op == "cookies":
        return {"cookies": d.get_cookies()}
    if op == "alert":
        try:
            a = d.switch_to.alert
            text = a.text
            a.dismiss()
            return {"alert": text}
        except NoAlertPresentException:
            return {"alert": None}
    if op == "screenshot":
        w = c["width"]
        metrics = lambda h: d.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
            "width": w, "height": h, "deviceScaleFactor": 1, "mobile": w < 600})
        metrics(900)
        time.sleep(0.3)
        height = d.execute_script(
            "return Math.max(document.body.scrollHeight, document.documentElement.scrollHeight)")
        metrics(min(max(height, 600), 6000))
        time.sleep(0.3)
        overflow = d.execute_script(
            "return document.documentElement.scrollWidth > window.innerWidth")
        d.save_screenshot(c["path"])
        d.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
        return {"overflow_x": overflow}
    if op == "logs":
        return {"logs": [e["message"] for e in d.get_log("browser")]}
    raise ValueError("unknown op " + op)


def main():
    d = browser()
    try:
        for line in sys.stdin:
            line = line.strip()
            if not line:
                continue
            c = json.loads(line)
            if c["op"] == "quit":
                print(json.dumps({"ok": True}), flush=True)
                break
            try:
                out = run(d, c)
                out["ok"] = True
            except Exception as e:  # the test reads the error
                out = {"ok": False, "error": f"{type(e).__name__}: {e}"}
            print(json.dumps(out), flush=True)
    finally:
        d.quit()


if __name__ == "__main__":
    main()
