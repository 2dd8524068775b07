//! `online`: `GET /api/online` for a viewer who may see none of the users
//! online (each hides its online status from non-contacts, and the viewer
//! is nobody's contact), with many users online written straight into
//! Redis. Latency of each page request while following the cursor: the
//! work per request is bounded, however many entries the viewer may not see.

use std::time::{Duration, Instant};

use clap::Args;
use serde_json::{json, Value};

use crate::report::{latency_histogram, Report};
use crate::{Common, Setup};

/// Flags of `online`.
#[derive(Args, Debug)]
pub struct OnlineArgs {
    /// Users online, none of them visible to the viewer.
    #[arg(long, default_value_t = 100_000)]
    pub online: usize,
    /// Page requests measured.
    #[arg(long, default_value_t = 2_000)]
    pub requests: usize,
    /// `limit` of each request.
    #[arg(long, default_value_t = 50)]
    pub limit: usize,
}

/// Requests sent before measuring (connections, script cache).
const WARM_UP: usize = 20;
/// A request slower than this fails the run: it would be the old unbounded scan.
const GIVE_UP: Duration = Duration::from_secs(30);

pub async fn run(common: &Common, args: &OnlineArgs) -> anyhow::Result<()> {
    let mut report = Report::new("online");
    let mut setup = Setup::redis(common)?;
    let mut redis = setup.redis_conn().await?;
    eprintln!("online: writing {} hidden online users", args.online);
    crate::fixture::live_leases(
        &mut redis,
        "on",
        args.online,
        crate::fixture::LEASE_VALUE,
        false,
    )
    .await?;
    crate::fixture::staggered_deadlines(&mut redis, "on", args.online, Some("contacts")).await?;
    setup.start_nodes(common, 1, None)?;
    let base = format!("http://{}/api/online", setup.nodes[0].addr);
    let http = reqwest::Client::builder().timeout(GIVE_UP).build()?;

    let mut hist = latency_histogram();
    let mut cursor: Option<String> = None;
    let (mut pages, mut wrapped, mut listed) = (0usize, 0usize, 0usize);
    for i in 0..WARM_UP + args.requests {
        let mut url = reqwest::Url::parse(&base)?;
        url.query_pairs_mut()
            .append_pair("limit", &args.limit.to_string())
            .append_pair("viewer", "stranger");
        if let Some(c) = &cursor {
            url.query_pairs_mut().append_pair("cursor", c);
        }
        let start = Instant::now();
        let resp = http.get(url).send().await?;
        anyhow::ensure!(resp.status().is_success(), "{}", resp.status());
        let body: Value = resp.json().await?;
        let took = start.elapsed();
        if i >= WARM_UP {
            hist.saturating_record(took.as_micros() as u64);
            pages += 1;
        }
        listed += body["users"].as_array().map_or(0, Vec::len);
        cursor = body["next_cursor"].as_str().map(str::to_string);
        if cursor.is_none() {
            wrapped += 1;
        }
    }
    anyhow::ensure!(
        listed == 0,
        "the viewer was shown {listed} users it may not see"
    );
    report.latency(
        "online_page",
        &hist,
        json!({"online": args.online, "visible_to_viewer": 0, "limit": args.limit,
               "pages": pages, "walked_to_the_end": wrapped, "target_p99_ms": 20}),
    );
    report.print_table();
    Ok(())
}
