"""The explorer page's HTML and style, and its script read from explorer.js beside this module (package data).

The script (vitcli/presentation/explorer.js, linted by `make lint-js`) decodes the float16 attention once, then draws
on demand: the main panel (the chosen head, the mean over heads, or the rollout) and one panel per head of the chosen
block, each a photo under a heat canvas of one pixel per patch. Every panel carries the numbers it draws (data-row: the
query's row over all tokens; data-scale-min and data-scale-max: the colour scale's ends), and #readout the hovered
source's numbers, so a test can read them back. The colours span the shown patch values' own range by default (a
near-uniform row still shows its structure), or start at 0 with the *colours from 0* box: `vitcli attend --scale
own|zero`, in the same words.
"""

import base64
import hashlib
from importlib.resources import files
from string import Template

STYLE = """
body { font: 14px system-ui, sans-serif; margin: 16px; color: #222; }
h1 { font-size: 18px; margin: 0 0 4px 0; }
.note { color: #555; font-size: 12px; margin: 2px 0; }
.random { color: #a00; font-weight: bold; }
.controls { display: flex; flex-wrap: wrap; gap: 16px; align-items: center; margin: 10px 0; }
.layout { display: flex; flex-wrap: wrap; gap: 20px; align-items: flex-start; }
.panel { display: inline-block; margin: 0 8px 8px 0; vertical-align: top; }
.stage { position: relative; cursor: crosshair; }
.stage img, .stage canvas { position: absolute; left: 0; top: 0; width: 100%; height: 100%; }
.stage canvas.heat { opacity: 0.7; image-rendering: pixelated; }
.caption { font-size: 12px; margin-top: 4px; }
.cls { border: 1px solid #888; border-radius: 3px; padding: 0 4px; margin-right: 4px; cursor: pointer; }
.scale { display: flex; align-items: center; gap: 6px; font-size: 12px; margin: 4px 0; }
.scale canvas { width: 160px; height: 12px; border: 1px solid #888; }
#readout { font-family: ui-monospace, monospace; min-height: 1.4em; margin: 8px 0; }
#top { font-family: ui-monospace, monospace; font-size: 12px; max-width: 400px; }
"""

# The page inlines the script (one self-contained file; the policy below allows it by the hash of exactly this text).
# It starts on the line after <script>, as it did when it lived in this module.
SCRIPT = "\n" + files("vitcli.presentation").joinpath("explorer.js").read_text(encoding="utf-8")


def script_source(script: str) -> str:
    """A Content-Security-Policy source allowing exactly this inline script (its text's SHA-256)."""
    return "'sha256-" + base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii") + "'"


SCRIPT_SOURCE = script_source(SCRIPT)


def page(script: str) -> Template:
    """The page around this inline script, as a string.Template whose placeholders are the data (a dollar sign in the
    script stays one)."""
    # Defence in depth behind building every text as text: the page runs its own script and nothing else (no inline
    # handler, no injected <script>, no javascript: URL), loads nothing but its inline data: images, and posts nowhere.
    # An embedding page's policy applies too (a srcdoc frame inherits it): the report's allows this script by its hash.
    policy = (
        f"default-src 'none'; script-src {script_source(script)}; style-src 'unsafe-inline'; img-src data:; "
        "base-uri 'none'; form-action 'none'"
    )
    return Template(
        """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
"""
        + f'<meta http-equiv="Content-Security-Policy" content="{policy}">'
        + """
<title>$title</title>
<link rel="icon" href="data:,">
<style>"""
        + STYLE
        + """</style>
</head>
<body>
<h1>$title</h1>
<p class="note" id="about"></p>
<p class="note random" id="random"></p>
<p class="note">Click a patch (or a CLS chip, or the button) to choose the query; arrow keys move it. Hover a patch
to read its weight. The rollout replaces the main panel; the head panels always show the chosen block.</p>
<div class="controls">
  <label>block <input type="range" id="block" min="0" value="0" step="1"> <b id="block-number"></b></label>
  <label>main panel <select id="head"><option value="mean">mean over heads</option></select></label>
  <label><input type="checkbox" id="rollout"> rollout</label>
  <label title="else the colours span the shown values' own range"><input type="checkbox" id="from-zero">
    colours from 0</label>
  <button id="cls" type="button">query CLS</button>
  <span id="query"></span>
</div>
<div id="readout">hover a patch to read its weight</div>
<div class="layout">
  <div>
    <div id="main"></div>
    <div class="scale" id="main-scale"><span class="bottom"></span> <canvas></canvas> <span class="top"></span>
      <span class="range"></span></div>
    <div id="top"></div>
  </div>
  <div>
    <div id="heads"></div>
    <div class="scale" id="heads-scale"><span class="bottom"></span> <canvas></canvas> <span class="top"></span>
      <span class="range"></span> (one scale for every head)</div>
  </div>
</div>
<p class="note" id="precision"></p>
<img id="explorer-crop" src="$crop" alt="" hidden>
<script type="application/json" id="explorer-header">$header</script>
<script type="text/plain" id="explorer-attention">$attention</script>
<script type="text/plain" id="explorer-rollout">$rollout</script>
<script>"""
        + script.replace("$", "$$")  # the page is a string.Template: a dollar sign in the script stays one
        + """</script>
</body>
</html>
"""
    )


PAGE = page(SCRIPT)
