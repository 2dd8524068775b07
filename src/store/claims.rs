//! The claim of a due `presence-leases` entry, so that exactly one node
//! departs a lapsed lease: taken by the deadline pass (`passes`) and by the
//! departure of a lease Redis announced as expired (`leases`), and passed
//! over by the online list (`lists`).

/// The fraction a claimed entry's score carries: deadlines are whole
/// milliseconds, so a half marks an entry someone is departing.
const TAKEN: f64 = 0.5;

/// How long a claim holds: an entry whose claimant failed to depart it (and
/// remove it) comes due again this long after its deadline.
const CLAIM_MS: f64 = 1_000.0;

/// Whether a `presence-leases` score marks a claimed entry.
pub fn is_taken(score: f64) -> bool {
    score.fract() != 0.0
}

/// The score that claims an entry whose score is `score`: its deadline plus
/// [`CLAIM_MS`], marked with [`TAKEN`] (a claimed one's, `CLAIM_MS` later).
/// It depends only on the entry, so two nodes claiming the same entry write
/// the same score and `ZADD XX GT CH` tells exactly one of them it changed
/// anything; a refresh that moved the deadline beyond it wins.
pub fn claim_score(score: f64) -> f64 {
    if is_taken(score) {
        score + CLAIM_MS
    } else {
        score + CLAIM_MS + TAKEN
    }
}

/// Adds the claim of `member` (score `score`) to `pipe`: its reply is 1 for
/// the one caller that claimed it, 0 for everyone else.
pub fn claim(pipe: &mut redis::Pipeline, index: &str, member: &str, score: f64) {
    pipe.cmd("ZADD")
        .arg(index)
        .arg("XX")
        .arg("GT")
        .arg("CH")
        .arg(claim_score(score))
        .arg(member);
}
