"""`vitcli report RUN_DIR`: HTML pages for a batch run (`vitcli run`).

The pages read the run's manifest(s) (manifest.json, or the shards' manifest-shardKofN.json, merged in memory the way
`vitcli merge` merges them) and the files each result lists, never a file outside the run folder. Two layouts
(layouts.py): one self-contained page with every figure embedded, for small runs; for larger ones an index page
(provenance, a sortable paginated summary, failures, timings) beside one page per image in the image's own result
folder, linking its figures by relative path, so every page stays small however many images the run holds. No page
loads anything from the network. Modules: reading (manifests, files, CSV excerpts), markup (escaping, the page frame,
style and script), sections (the parts of a page; `image_body` draws one image, explore's page in a sandboxed
iframe), audits (explain's audit tables), layouts (which pages, written through the output store).
"""
