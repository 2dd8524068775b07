#!/usr/bin/env python3
"""A simulation of the node's setup gate and its shed wait (src/lease/shed.rs).

n clients arrive within 0.5 s at a node that lets in A a second through 128
places (each setup holds a place for 128 / A s). A client shed with wait w
comes back after w plus up to w more at random, as the JS client does. Prints,
for each wait policy, when the last client got in and how many attempts were
shed (mean of three seeds). It leaves out that on a real node each shed
attempt also takes CPU from the admissions.

Usage: bench/scripts/shed-sim.py
"""
import heapq
import random

PLACES = 128


def simulate(n, rate, policy, seed):
    random.seed(seed)
    hold = PLACES / rate
    arrivals = [(random.uniform(0, 0.5), i) for i in range(n)]
    heapq.heapify(arrivals)
    busy, last, sheds = [], 0.0, 0
    while arrivals:
        t, i = heapq.heappop(arrivals)
        while busy and busy[0] <= t:
            heapq.heappop(busy)
        if len(busy) < PLACES:
            heapq.heappush(busy, t + hold)
            policy.admitted(t)
            last = t
        else:
            w = policy.shed(t) / 1000
            sheds += 1
            heapq.heappush(arrivals, (t + w + random.uniform(0, w), i))
    return last, sheds


class Fixed:
    def admitted(self, t):
        pass

    def shed(self, t):
        return 1000


class Aimed:
    """The server's policy: the wait aimed at `k` shed per one let in."""

    def __init__(self, k, lo=1000, hi=15000):
        self.k, self.lo, self.hi = k, lo, hi
        self.wait, self.since, self.a, self.s = lo, 0.0, 0, 0

    def roll(self, t):
        if t - self.since < 1:
            return
        w = self.wait * self.s / (self.k * max(self.a, 1))
        w = min(max(w, self.wait / 2), self.wait * 2)
        w /= 2 ** min(int(t - self.since) - 1, 16)
        self.wait = min(max(w, self.lo), self.hi)
        self.since, self.a, self.s = t, 0, 0

    def admitted(self, t):
        self.roll(t)
        self.a += 1

    def shed(self, t):
        self.roll(t)
        self.s += 1
        return self.wait


policies = [("fixed 1 s", Fixed)] + [
    ("aimed at %d" % k, (lambda k=k: Aimed(k))) for k in (1, 4, 8)
]
for n, rate in [(1666, 185), (3333, 35), (8000, 185)]:
    print("%d clients, %d let in a second (ideal %.1f s)" % (n, rate, n / rate))
    for name, make in policies:
        runs = [simulate(n, rate, make(), seed) for seed in range(3)]
        print("  %-12s all in after %5.1f s, %7.0f sheds"
              % (name, sum(r[0] for r in runs) / 3, sum(r[1] for r in runs) / 3))
