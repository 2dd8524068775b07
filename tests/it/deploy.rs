//! The deploy files pass the node only flags and environment variables it
//! takes: `presence-server --check-config` runs with what
//! deploy/kubernetes (the Deployment's args and env, the ConfigMap, the
//! Secret), deploy/presence.service and the Containerfile give it, exits 0,
//! and names each variable as the source of a setting (clap ignores a
//! variable no flag reads, so a misspelt one would pass unseen otherwise).
//! The Kubernetes files also agree with each other: the probes reach the
//! internal listener, the grace period covers the drain, and the Service
//! and the PodDisruptionBudget select the Deployment's pods.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Output};

use yaml_rust2::{Yaml, YamlLoader};

use crate::common::binary;

/// Variables the files set that are no flag's.
const NOT_FLAGS: &[&str] = &["RUST_LOG", "PATH"];

/// Stands in for what Kubernetes fills in (`valueFrom`).
const POD_NAME: &str = "presence-5d8f9c7b4-x2x7q";

/// A JWT secret of the length the node asks for.
const JWT_SECRET: &str = "a-test-secret-of-at-least-32-bytes-0123456789";

fn read(rel: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// `presence-server --check-config ARGS` with only `env` in its environment.
fn check_config(args: &[String], env: &[(String, String)]) -> Output {
    Command::new(binary())
        .arg("--check-config")
        .args(args)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .expect("presence-server --check-config")
}

/// `--check-config` accepts `args` and `env`, and each of them is the
/// source of a setting; returns what it printed.
fn assert_accepted(what: &str, args: &[String], env: &[(String, String)]) -> String {
    let out = check_config(args, env);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{what}: presence-server --check-config {args:?} with {:?} refused them ({}): {stderr}\n{stdout}",
        env.iter().map(|(k, _)| k).collect::<Vec<_>>(),
        out.status
    );
    for (name, _) in env.iter().filter(|(n, _)| !NOT_FLAGS.contains(&n.as_str())) {
        let source = format!("# env {name}");
        assert!(
            stdout.lines().any(|l| l.trim_end().ends_with(&source)),
            "{what}: {name} is no flag's environment variable (presence-server --help lists them):\n{stdout}"
        );
    }
    for arg in args.iter().filter(|a| a.starts_with("--")) {
        let flag = arg.split('=').next().unwrap();
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with(&format!("{flag} = ")) && l.trim_end().ends_with("# flag")),
            "{what}: {flag} is not a setting of --check-config's output:\n{stdout}"
        );
    }
    stdout
}

/// `--check-config` refuses `env` with a message that contains `needle`.
fn assert_refused(what: &str, env: &[(String, String)], needle: &str) {
    let out = check_config(&[], env);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{what}: {stderr}");
    assert!(
        stderr.contains(needle),
        "{what}: no {needle:?} in: {stderr}"
    );
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

// ---- deploy/kubernetes ----

/// The one document of deploy/kubernetes/`file`, checked to be of `kind`.
fn manifest(file: &str, kind: &str) -> Yaml {
    let rel = format!("deploy/kubernetes/{file}");
    let mut docs = YamlLoader::load_from_str(&read(&rel)).unwrap_or_else(|e| panic!("{rel}: {e}"));
    assert_eq!(docs.len(), 1, "{rel}: one document expected");
    let doc = docs.remove(0);
    assert_eq!(at(&doc, "kind").as_str(), Some(kind), "{rel}");
    doc
}

/// The node at a dotted `path` (`spec.template.spec.containers.0`); panics
/// with the path when it is missing.
fn at<'a>(doc: &'a Yaml, path: &str) -> &'a Yaml {
    path.split('.').fold(doc, |node, key| {
        let next = match key.parse::<usize>() {
            Ok(i) => &node[i],
            Err(_) => &node[key],
        };
        assert!(!next.is_badvalue(), "no {path} (at {key}) in {doc:?}");
        next
    })
}

fn string(y: &Yaml) -> String {
    match y {
        Yaml::String(s) | Yaml::Real(s) => s.clone(),
        Yaml::Integer(i) => i.to_string(),
        Yaml::Boolean(b) => b.to_string(),
        other => panic!("not a scalar: {other:?}"),
    }
}

/// A sequence of scalars (a container's `args`).
fn strings(y: &Yaml) -> Vec<String> {
    y.as_vec()
        .unwrap_or_else(|| panic!("not a sequence: {y:?}"))
        .iter()
        .map(string)
        .collect()
}

/// A mapping of scalars (a ConfigMap's `data`, a `matchLabels`).
fn string_map(y: &Yaml) -> BTreeMap<String, String> {
    y.as_hash()
        .unwrap_or_else(|| panic!("not a mapping: {y:?}"))
        .iter()
        .map(|(k, v)| (string(k), string(v)))
        .collect()
}

/// `labels` has every entry of `selector`.
fn selects(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// The value of `--flag=value` in `args`.
fn arg_value<'a>(args: &'a [String], flag: &str) -> &'a str {
    args.iter()
        .find_map(|a| a.strip_prefix(&format!("{flag}=")))
        .unwrap_or_else(|| panic!("the Deployment's args have no {flag}=...: {args:?}"))
}

/// The port of `host:port`.
fn port_of(addr: &str) -> i64 {
    addr.rsplit(':').next().unwrap().parse().unwrap()
}

/// The container's port named `name`.
fn container_port(container: &Yaml, name: &str) -> i64 {
    at(container, "ports")
        .as_vec()
        .unwrap()
        .iter()
        .find(|p| p["name"].as_str() == Some(name))
        .and_then(|p| p["containerPort"].as_i64())
        .unwrap_or_else(|| panic!("the container has no port named {name}"))
}

/// The Deployment's container args, and the environment it gets from its
/// `env` (`valueFrom` filled in as Kubernetes would), the ConfigMap and
/// the Secret.
fn kubernetes_settings(deployment: &Yaml) -> (Vec<String>, Vec<(String, String)>) {
    let container = at(deployment, "spec.template.spec.containers.0");
    // The image has no ENTRYPOINT: args alone would replace its CMD.
    assert_eq!(strings(at(container, "command")), ["presence-server"]);
    let args = strings(at(container, "args"));

    let config = manifest("configmap.yaml", "ConfigMap");
    let secret = manifest("secret.yaml", "Secret");
    assert!(
        secret["data"].is_badvalue(),
        "secret.yaml: keep its values readable in stringData"
    );
    let mut loaded = Vec::new();
    let mut env = Vec::new();
    for source in at(container, "envFrom").as_vec().unwrap() {
        let (kind, doc, data) = if source["configMapRef"].is_badvalue() {
            ("secretRef", &secret, "stringData")
        } else {
            ("configMapRef", &config, "data")
        };
        assert_eq!(
            at(source, &format!("{kind}.name")),
            at(doc, "metadata.name"),
            "envFrom names another {kind} than the one shipped"
        );
        loaded.push(kind);
        env.extend(string_map(at(doc, data)));
    }
    assert_eq!(
        loaded,
        ["configMapRef", "secretRef"],
        "envFrom loads the ConfigMap and the Secret"
    );
    for var in at(container, "env").as_vec().unwrap() {
        let name = string(at(var, "name"));
        let value = if var["valueFrom"].is_badvalue() {
            string(at(var, "value"))
        } else {
            assert_eq!(
                at(var, "valueFrom.fieldRef.fieldPath").as_str(),
                Some("metadata.name")
            );
            POD_NAME.to_string()
        };
        env.push((name, value));
    }
    (args, env)
}

#[test]
fn kubernetes_passes_the_node_only_settings_it_takes() {
    let deployment = manifest("deployment.yaml", "Deployment");
    let (args, env) = kubernetes_settings(&deployment);
    let out = assert_accepted("deploy/kubernetes", &args, &env);
    assert!(
        out.contains("--auth = jwt"),
        "the Deployment runs jwt auth:\n{out}"
    );
}

#[test]
fn kubernetes_probes_ports_and_grace_fit_the_node() {
    let deployment = manifest("deployment.yaml", "Deployment");
    let (args, _) = kubernetes_settings(&deployment);
    let pod = at(&deployment, "spec.template.spec");
    let container = at(pod, "containers.0");
    let internal = port_of(arg_value(&args, "--internal-listen"));
    assert_eq!(container_port(container, "internal"), internal);
    assert_eq!(
        container_port(container, "http"),
        port_of(arg_value(&args, "--listen"))
    );
    for (probe, path) in [
        ("startupProbe", "/livez"),
        ("livenessProbe", "/livez"),
        ("readinessProbe", "/readyz"),
    ] {
        let get = at(container, &format!("{probe}.httpGet"));
        assert_eq!(at(get, "path").as_str(), Some(path), "{probe}");
        // Under --internal-listen the probes answer only there.
        assert_eq!(at(get, "port").as_str(), Some("internal"), "{probe}");
    }
    // The drain delay, then the sessions' close and the webhooks' drain
    // (each up to SHUTDOWN_TIMEOUT), all before kubelet's SIGKILL.
    let drain_ms: u64 = arg_value(&args, "--drain-delay-ms").parse().unwrap();
    assert!(
        drain_ms > 0,
        "the pods need a drain delay: there is no preStop"
    );
    let stop_ms = drain_ms + 2 * presence_server::server::SHUTDOWN_TIMEOUT.as_millis() as u64;
    let grace = at(pod, "terminationGracePeriodSeconds").as_i64().unwrap() as u64;
    assert!(
        grace * 1000 > stop_ms,
        "terminationGracePeriodSeconds {grace} does not cover the {stop_ms} ms a stop may take"
    );
    assert_eq!(
        at(pod, "securityContext.runAsUser").as_i64(),
        Some(65534),
        "the image's USER"
    );

    let labels = string_map(at(&deployment, "spec.template.metadata.labels"));
    let selector = string_map(at(&deployment, "spec.selector.matchLabels"));
    assert!(selects(&selector, &labels), "the Deployment's selector");
    let pdb = manifest("pdb.yaml", "PodDisruptionBudget");
    assert!(
        selects(&string_map(at(&pdb, "spec.selector.matchLabels")), &labels),
        "pdb.yaml's selector"
    );
    let service = manifest("service.yaml", "Service");
    assert!(
        selects(&string_map(at(&service, "spec.selector")), &labels),
        "service.yaml's selector"
    );
    let target = at(&service, "spec.ports.0.targetPort").as_str().unwrap();
    assert_eq!(
        target, "http",
        "the Service sends clients to the public listener"
    );
}

// ---- deploy/presence.service ----

#[test]
fn the_systemd_unit_passes_the_node_only_settings_it_takes() {
    let unit = read("deploy/presence.service");
    let mut env = Vec::new();
    let mut args = None;
    for line in unit.lines().map(str::trim) {
        if let Some(assignment) = line.strip_prefix("Environment=") {
            assert!(
                !assignment.contains(['"', ' ']),
                "one unquoted variable a line: {line}"
            );
            let (k, v) = assignment.split_once('=').unwrap();
            env.push((k.to_string(), v.to_string()));
        } else if let Some(command) = line.strip_prefix("ExecStart=") {
            let mut words = command.split_whitespace().map(str::to_string);
            assert!(
                words.next().unwrap().ends_with("/presence-server"),
                "{line}"
            );
            args = Some(words.collect::<Vec<_>>());
        }
    }
    let args = args.expect("the unit has an ExecStart=");
    assert!(!env.is_empty(), "the unit sets no Environment=");
    assert_accepted("deploy/presence.service", &args, &env);
    // With what its header tells to put in /etc/presence/presence.env.
    env.extend(pairs(&[
        ("REDIS_URL", "redis://10.0.0.6:6379/0"),
        ("PRESENCE_AUTH", "jwt"),
        ("PRESENCE_JWT_SECRET", JWT_SECRET),
    ]));
    assert_accepted("deploy/presence.service with presence.env", &args, &env);
}

// ---- Containerfile ----

/// The Containerfile's `ENV` variables and `CMD`.
fn containerfile() -> (Vec<(String, String)>, Vec<String>) {
    let text = read("Containerfile");
    // Instructions, their continuation lines joined.
    let joined = text
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n")
        .replace("\\\n", " ");
    let mut env = Vec::new();
    let mut cmd = None;
    for line in joined.lines() {
        if let Some(rest) = line.strip_prefix("ENV ") {
            for word in rest.split_whitespace() {
                assert!(!word.contains('"'), "ENV KEY=value without quotes: {line}");
                let (k, v) = word
                    .split_once('=')
                    .unwrap_or_else(|| panic!("ENV KEY=value: {line}"));
                env.push((k.to_string(), v.to_string()));
            }
        } else if let Some(rest) = line.strip_prefix("CMD ") {
            cmd = Some(serde_json::from_str::<Vec<String>>(rest).expect("CMD in exec form"));
        }
    }
    (env, cmd.expect("the Containerfile has a CMD"))
}

#[test]
fn the_image_passes_the_node_only_settings_it_takes() {
    let (image_env, cmd) = containerfile();
    assert_eq!(cmd[0], "presence-server", "found on the image's PATH");
    let path = &image_env
        .iter()
        .find(|(k, _)| k == "PATH")
        .expect("ENV PATH")
        .1;
    assert!(
        path.split(':').any(|d| d == "/usr/local/bin"),
        "deploy/image/build.sh puts the binary in /usr/local/bin"
    );
    let args = cmd[1..].to_vec();
    let with = |extra: &[(&str, &str)]| {
        let mut env = image_env.clone();
        env.extend(pairs(extra));
        env
    };
    let production = with(&[
        ("REDIS_URL", "redis://redis:6379/0"),
        ("PRESENCE_AUTH", "jwt"),
        ("PRESENCE_JWT_SECRET", JWT_SECRET),
    ]);
    let out = assert_accepted("the Containerfile", &args, &production);
    assert!(out.contains("--listen = 0.0.0.0:8080"), "{out}");
    // What the image needs besides: a Redis, and an auth choice.
    assert_refused(
        "the image with no REDIS_URL",
        &with(&[
            ("PRESENCE_AUTH", "jwt"),
            ("PRESENCE_JWT_SECRET", JWT_SECRET),
        ]),
        "REDIS_URL",
    );
    assert_refused(
        "the image under dev auth",
        &with(&[("REDIS_URL", "redis://redis:6379/0")]),
        "--allow-insecure-dev-auth",
    );
}
