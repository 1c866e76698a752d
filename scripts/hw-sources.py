#!/usr/bin/python3
"""Regenerate the "Prices" and "Source of every figure" sections of hw/README.md from the
catalogue files: one line per GPU profile with its on-demand price, the list it comes from and
its date (or why it has none), then one table per profile of the figures it documents itself
(parts document their own), so the README never disagrees with the data.
usage: scripts/hw-sources.py [--check]"""
import json
import os
import sys

HW = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "hw")
KIND_ORDER = {"gpu": 0, "link": 1, "disk": 2, "host": 3, "runtime": 4}


def load(name):
    with open(os.path.join(HW, name + ".json")) as f:
        return json.load(f)


def gpu_order(d):
    # by memory bandwidth, the order a reader compares GPUs in
    g = d.get("gpu")
    return g.get("mem_bw_gbps", 0) if isinstance(g, dict) else 0


def section(name, d):
    out = ["### " + name, ""]
    comp = []
    for sec in ("gpu", "link", "host", "disk", "runtime", "interconnect"):
        v = d.get(sec)
        if d["kind"] == sec:
            continue
        if isinstance(v, str):
            comp.append("`%s` = part `%s`" % (sec, v))
        elif isinstance(v, dict) and "base" in v:
            comp.append("`%s` = part `%s` with overrides" % (sec, v["base"]))
    if comp:
        out += ["Composed from: " + ", ".join(comp) + ".", ""]
    if d.get("fitted"):
        out += ["Fitted from measurements: " + ", ".join("`%s`" % f for f in d["fitted"]) + ".", ""]
    out += ["| figure | value | source | date |", "|---|---|---|---|"]
    for s in d.get("sources", []):
        v = s["value"]
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        out.append("| `%s` | %s | %s | %s |" % (s["figure"], v, s["source"], s["date"]))
    return "\n".join(out) + "\n"


def gpus(d):
    ic = d.get("interconnect")
    return ic.get("gpus", 1) if isinstance(ic, dict) else 1


def prices(names, docs):
    out = ["## Prices", "",
           "On-demand price of each GPU profile's whole machine (all its GPUs), the list it was read from and",
           "its date; a profile without a price says why. `ferry plan` and the report's what-if use them.", "",
           "| profile | GPUs | USD/h | per GPU | list | date |", "|---|---|---|---|---|---|"]
    for n in names:
        d = docs[n]
        if d["kind"] != "gpu":
            continue
        src = [s for s in d.get("sources", []) if s["figure"] == "price_per_hour_usd"]
        p = d.get("price_per_hour_usd", 0)
        g = gpus(d)
        if src:
            text, date = src[-1]["source"], src[-1]["date"]
        else:
            text, date = "(no source given)", "-"
        text = text.replace("; approximate, check current pricing", "")
        if p:
            out.append("| `%s` | %d | %g | %.3g | %s | %s |" % (n, g, p, p / g, text, date))
        else:
            out.append("| `%s` | %d | - | - | %s | %s |" % (n, g, text, date))
    return "\n".join(out) + "\n\n"


def main():
    names = sorted(f[:-5] for f in os.listdir(HW) if f.endswith(".json"))
    docs = {n: load(n) for n in names}
    names.sort(key=lambda n: (KIND_ORDER.get(docs[n]["kind"], 9), gpu_order(docs[n]), n))
    body = prices(names, docs) + "## Source of every figure\n\n" + "\n".join(section(n, docs[n]) for n in names)
    readme = os.path.join(HW, "README.md")
    text = open(readme).read()
    start = text.find("## Prices")
    head = text[: start if start >= 0 else text.index("## Source of every figure")]
    new = head + body
    if "--check" in sys.argv:
        if new != text:
            sys.exit("hw/README.md is out of date: run scripts/hw-sources.py")
        return
    with open(readme, "w") as f:
        f.write(new)


main()
