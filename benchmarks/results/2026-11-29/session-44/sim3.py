import sys, statistics, random
sys.path.insert(0, "tests")
import specdec.adaptive as A
from specdec.adaptive import GammaController
curve = {1: .0465, 2: .0564, 3: .061, 4: .0655, 5: .076, 6: .087, 7: .098, 8: .109, 9: .12}
V = lambda k: curve[k + 1]
def simulate(choose_k, alpha_at, draft_s, verify_s, catch_up_s, steps, seed, controller=None):
    rng = random.Random(seed); tokens = seconds = 0.0; behind = 0
    for step in range(steps):
        k = choose_k(); alpha = alpha_at(step)
        draft_time = k * draft_s + (catch_up_s if k and behind else 0.0)
        accepted = 0
        while accepted < k and rng.random() < alpha: accepted += 1
        verify_time = verify_s(k)
        if controller is not None: controller.update(k, accepted, draft_time, verify_time)
        behind = 0 if k else behind + 1
        tokens += accepted + 1; seconds += draft_time + verify_time
    return tokens / seconds
orig_update, orig_choose = GammaController.update, GammaController.choose
def no_reset_update(self, proposed, accepted, draft_s, verify_s):
    wait = self._explore_wait
    orig_update(self, proposed, accepted, draft_s, verify_s)
    self._explore_wait = wait
def cap1_choose(self):
    k = orig_choose(self)
    return min(k, 1) if self.optimistic and self._trials_seen < A.TRIALS_TO_JUDGE else k
variants = {"current": (orig_update, orig_choose), "no-reset": (no_reset_update, orig_choose),
            "cap1": (orig_update, cap1_choose), "no-reset+cap1": (no_reset_update, cap1_choose)}
steps = int(sys.argv[1])
scen = {f"a{a}": (lambda a: (lambda s: a))(a) for a in (0.3, 0.5, 0.7, 0.8, 0.9)}
scen["switch.4/.9@30"] = lambda s: 0.4 if (s // 30) % 2 == 0 else 0.9
scen["switch.9/.4@30"] = lambda s: 0.9 if (s // 30) % 2 == 0 else 0.4
for sname, af in scen.items():
    out = {}
    for name, (u, ch) in variants.items():
        GammaController.update, GammaController.choose = u, ch
        rates = [simulate((c := GammaController.from_measured(8, dict(curve), 0.0233)).choose, af, 0.0233, V, 0.035, steps, seed, c) for seed in range(80)]
        out[name] = round(statistics.mean(rates) * .0465, 3)
    GammaController.update, GammaController.choose = orig_update, orig_choose
    print(sname, out)
