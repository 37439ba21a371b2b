"""The long-context code prompts of this session's runs: six Python standard-library modules (their
first 10 000 characters, ~2.4–3k tokens) each followed by a request to summarise it and list its public
functions. Written to /tmp/long_code.jsonl for `specdec bench --dataset /tmp/long_code.jsonl`."""
import json
import os
import sysconfig

std = sysconfig.get_paths()["stdlib"]
files = ["textwrap.py", "shlex.py", "fnmatch.py", "bisect.py", "heapq.py", "queue.py", "sched.py", "glob.py"]
out = []
for name in files:
    path = os.path.join(std, name)
    if not os.path.exists(path):
        continue
    src = open(path).read()[:10000]
    out.append({"prompt": f"Here is a Python module:\n\n```python\n{src}\n```\n\nWrite a concise summary of what this "
                          "module provides, then list its public functions with one line each.", "category": "long_code"})
    if len(out) == 6:
        break
with open("/tmp/long_code.jsonl", "w") as f:
    for item in out:
        f.write(json.dumps(item) + "\n")
