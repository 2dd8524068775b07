//! The optional TOML config file (`--config path`, or `PRESENCE_CONFIG`).
//!
//! Its keys are the long flag names (`heartbeat-ms = 15000`; `heartbeat_ms`
//! works too). Rather than a second settings struct that could drift from
//! the flags, each key is handed to clap through the flag's own environment
//! variable, and only when that variable is not set already. So every flag
//! that has an env var can be set in the file, and the precedence is
//! flag > env > file > default without a line of merging code.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context as _};

/// Flags that make no sense in the file.
const NOT_IN_FILE: &[&str] = &["config", "help", "version"];

/// Reads `path` and sets, for each key, the environment variable of the
/// flag it names, unless that variable is already set. Returns the names of
/// the variables it set. Must run before any other thread starts (it writes
/// the process environment).
pub fn apply(path: &Path, command: &clap::Command) -> anyhow::Result<Vec<String>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read config file {}", path.display()))?;
    let table: BTreeMap<String, toml::Value> = toml::from_str(&text)
        .with_context(|| format!("config file {} is not valid TOML", path.display()))?;
    let envs = flag_envs(command);
    let mut set = Vec::new();
    for (key, value) in table {
        let flag = key.replace('_', "-");
        let Some(env) = envs.get(flag.as_str()) else {
            let known: Vec<&str> = envs.keys().copied().collect();
            bail!(
                "config file {}: unknown key {key:?}; known keys: {}",
                path.display(),
                known.join(", ")
            );
        };
        let value = match value {
            // List flags take comma-separated values.
            toml::Value::Array(items) => {
                let mut parts = Vec::with_capacity(items.len());
                for item in items {
                    parts.push(scalar(&key, path, item)?);
                }
                parts.join(",")
            }
            other => scalar(&key, path, other)?,
        };
        if std::env::var_os(env).is_none() {
            std::env::set_var(env, value);
            set.push(env.to_string());
        }
    }
    Ok(set)
}

/// A string, number or boolean as the text a flag would be given.
fn scalar(key: &str, path: &Path, value: toml::Value) -> anyhow::Result<String> {
    Ok(match value {
        toml::Value::String(s) => s,
        toml::Value::Integer(i) => i.to_string(),
        toml::Value::Float(f) => f.to_string(),
        toml::Value::Boolean(b) => b.to_string(),
        other => bail!(
            "config file {}: {key} must be a string, number, boolean or a list of them, not {}",
            path.display(),
            other.type_str()
        ),
    })
}

/// Long flag name -> its environment variable, for every flag that has one.
fn flag_envs(command: &clap::Command) -> BTreeMap<&str, &str> {
    command
        .get_arguments()
        .filter_map(|a| Some((a.get_long()?, a.get_env()?.to_str()?)))
        .filter(|(long, _)| !NOT_IN_FILE.contains(long))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn command() -> clap::Command {
        clap::Command::new("t")
            .arg(
                clap::Arg::new("alpha-ms")
                    .long("alpha-ms")
                    .env("CONFIG_FILE_TEST_ALPHA_MS"),
            )
            .arg(
                clap::Arg::new("beta")
                    .long("beta")
                    .env("CONFIG_FILE_TEST_BETA"),
            )
            .arg(
                clap::Arg::new("config")
                    .long("config")
                    .env("CONFIG_FILE_TEST_CONFIG"),
            )
    }

    fn write(text: &str) -> tempfile::NamedTempFile {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), text).unwrap();
        f
    }

    #[test]
    fn sets_unset_envs_and_leaves_set_ones() {
        std::env::set_var("CONFIG_FILE_TEST_BETA", "from-env");
        let f = write("alpha_ms = [700, 800]\nbeta = \"from-file\"\n");
        let set = apply(f.path(), &command()).unwrap();
        assert_eq!(set, ["CONFIG_FILE_TEST_ALPHA_MS"]);
        assert_eq!(
            std::env::var("CONFIG_FILE_TEST_ALPHA_MS").unwrap(),
            "700,800"
        );
        assert_eq!(std::env::var("CONFIG_FILE_TEST_BETA").unwrap(), "from-env");
    }

    #[test]
    fn refuses_unknown_keys_bad_values_and_bad_toml() {
        let err = apply(write("gamma = 1\n").path(), &command()).unwrap_err();
        assert!(
            format!("{err:#}").contains("unknown key \"gamma\""),
            "{err:#}"
        );
        let err = apply(write("config = \"x\"\n").path(), &command()).unwrap_err();
        assert!(format!("{err:#}").contains("unknown key"), "{err:#}");
        let err = apply(write("alpha-ms = { a = 1 }\n").path(), &command()).unwrap_err();
        assert!(format!("{err:#}").contains("must be a string"), "{err:#}");
        let err = apply(write("alpha-ms = [[1]]\n").path(), &command()).unwrap_err();
        assert!(format!("{err:#}").contains("must be a string"), "{err:#}");
        let err = apply(write("alpha-ms = \n").path(), &command()).unwrap_err();
        assert!(format!("{err:#}").contains("not valid TOML"), "{err:#}");
        let err = apply(Path::new("/nonexistent/presence.toml"), &command()).unwrap_err();
        assert!(format!("{err:#}").contains("cannot read"), "{err:#}");
    }
}
