//! Reading the fields of a Redis reply strictly: a value that may be
//! missing is an `Option`, and one that is there but does not parse is a
//! [`StoreError::Reply`] naming the key it came from, never a silent 0.

use redis::Value;

use super::{StoreError, StoreResult};

/// The elements of an array reply (a script's `{...}`); a server error is
/// passed on as such.
pub(super) fn array<'v>(v: &'v Value, key: &str) -> StoreResult<&'v [Value]> {
    match v {
        Value::Array(items) => Ok(items),
        Value::ServerError(e) => Err(redis::RedisError::from(e.clone()).into()),
        other => Err(StoreError::reply(
            key,
            format!("expected an array, got {other:?}"),
        )),
    }
}

/// An element of an array reply; missing is an error.
pub(super) fn at<'v>(items: &'v [Value], i: usize, key: &str) -> StoreResult<&'v Value> {
    items
        .get(i)
        .ok_or_else(|| StoreError::reply(key, format!("field {i} missing from {items:?}")))
}

/// An integer (a Lua number, or a string holding one).
pub(super) fn int(v: &Value, key: &str) -> StoreResult<i64> {
    match v {
        Value::Int(n) => Ok(*n),
        Value::BulkString(b) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| StoreError::reply(key, format!("not a number: {v:?}"))),
        Value::ServerError(e) => Err(redis::RedisError::from(e.clone()).into()),
        other => Err(StoreError::reply(key, format!("not a number: {other:?}"))),
    }
}

/// A string field ("" stands for "not set" in the scripts' replies).
pub(super) fn text(v: &Value, key: &str) -> StoreResult<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone())
            .map_err(|_| StoreError::reply(key, format!("not UTF-8: {v:?}"))),
        Value::SimpleString(s) => Ok(s.clone()),
        Value::Int(n) => Ok(n.to_string()),
        other => Err(StoreError::reply(key, format!("not a string: {other:?}"))),
    }
}

/// A number written as a string that may be unset (""): `None` then; a
/// string that is set but not a number is an error.
pub(super) fn opt_int(v: &Value, key: &str) -> StoreResult<Option<i64>> {
    let s = text(v, key)?;
    if s.is_empty() {
        return Ok(None);
    }
    s.parse()
        .map(Some)
        .map_err(|_| StoreError::reply(key, format!("not a number: {s:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn numbers_parse_or_fail_loudly() {
        assert_eq!(int(&Value::Int(7), "k").unwrap(), 7);
        assert_eq!(int(&bulk("42"), "k").unwrap(), 42);
        let err = int(&bulk("4x2"), "presence-status:{bob}").unwrap_err();
        assert!(err.to_string().contains("presence-status:{bob}"), "{err}");
        assert!(int(&Value::Nil, "k").is_err());
        assert_eq!(opt_int(&bulk(""), "k").unwrap(), None);
        assert_eq!(opt_int(&bulk("17"), "k").unwrap(), Some(17));
        assert!(opt_int(&bulk("soon"), "k").is_err());
    }

    #[test]
    fn arrays_and_fields_are_checked() {
        let v = Value::Array(vec![Value::Int(1)]);
        let items = array(&v, "k").unwrap();
        assert!(at(items, 0, "k").is_ok());
        assert!(at(items, 1, "k").is_err());
        assert!(array(&Value::Int(1), "k").is_err());
    }
}
