"""A short streamed request sent 1.5 s after a long prompt: its total time and the long prompt's TTFT, per server.

Usage (as run in session 64): python long_prompt_neighbour.py PORT[,PORT...] REPEATS — now a thin wrapper over
benchmarks/long_prompts_served.py (``neighbour``), which holds the client."""
import subprocess
import sys
from pathlib import Path

script = Path(__file__).resolve().parents[3] / "long_prompts_served.py"
sys.exit(subprocess.call([sys.executable, str(script), "neighbour", "--ports", sys.argv[1], "--repeats", sys.argv[2]]))
