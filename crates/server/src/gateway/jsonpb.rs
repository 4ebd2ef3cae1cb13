//! Request messages from JSON as etcd's gateway reads them: grpc-gateway's `JSONPb` over
//! golang/protobuf's `jsonpb.Unmarshaler` with unknown fields allowed (etcd 3.5's library
//! version; etcd 3.4's older one words two enum errors differently, see [`enum_value`]).
//!
//! What that means, and what a client sees:
//! - a message is a JSON object (or `null`, the empty message); fields are found by their
//!   proto name or their JSON (lowerCamelCase) name, the latter winning; a field given as
//!   `null` is left unset; unknown names are ignored; of duplicate keys the last counts;
//! - integers may be numbers or strings holding a number (`"5"`); bytes are standard base64
//!   (or, as Go allows, an array of byte values); enums are names or numbers (any number);
//! - anything else is refused with Go's `encoding/json` text, e.g.
//!   `json: cannot unmarshal number into Go value of type []uint8`,
//!   `illegal base64 data at input byte 4`, `json: cannot unmarshal number 1.5 into Go value
//!   of type int64`, checked field by field in declaration order, as jsonpb does.
//!
//! The message is built as a `prost_reflect::DynamicMessage` from the descriptors that
//! `etcdrs_proto` compiled, then transcoded into the generated type.

use std::sync::OnceLock;

use prost_reflect::{
    DescriptorPool, DynamicMessage, FieldDescriptor, Kind, MessageDescriptor, Value,
};

use super::gojson::{self, Json};

fn pool() -> Option<&'static DescriptorPool> {
    static POOL: OnceLock<Option<DescriptorPool>> = OnceLock::new();
    POOL.get_or_init(|| DescriptorPool::decode(etcdrs_proto::FILE_DESCRIPTOR_SET).ok())
        .as_ref()
}

/// `T` from one JSON value, or Go's error text.
pub fn decode<T: prost::Message + prost::Name + Default>(json: &Json) -> Result<T, String> {
    let name = T::full_name();
    let descriptor = pool()
        .and_then(|pool| pool.get_message_by_name(&name))
        .ok_or_else(|| format!("no descriptor for {name}"))?;
    let message = message(json, &descriptor, 0)?;
    message.transcode_to::<T>().map_err(|e| e.to_string())
}

/// Go's `UnmarshalTypeError` text.
fn type_error(what: &str, go_type: &str) -> String {
    format!("json: cannot unmarshal {what} into Go value of type {go_type}")
}

/// How deep messages may nest (a transaction in a transaction...): prost's recursion limit,
/// so the gateway refuses what the gRPC port's decoder refuses, with its text. Go's jsonpb
/// recurses on stacks that grow; ours are a tokio worker's 2 MiB.
const MAX_MESSAGE_DEPTH: usize = 100;

fn message(
    json: &Json,
    descriptor: &MessageDescriptor,
    depth: usize,
) -> Result<DynamicMessage, String> {
    if depth >= MAX_MESSAGE_DEPTH {
        return Err("failed to decode Protobuf message: recursion limit reached".to_owned());
    }
    let mut message = DynamicMessage::new(descriptor.clone());
    let members = match json {
        Json::Null => return Ok(message),
        Json::Object(members) => members,
        other => {
            return Err(type_error(other.kind(), "map[string]json.RawMessage"));
        }
    };
    // Of duplicate keys the last counts, as in a Go map.
    let lookup = |name: &str| {
        members
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v)
    };
    for field in descriptor.fields() {
        let raw = lookup(field.json_name()).or_else(|| lookup(field.name()));
        let Some(raw) = raw.filter(|raw| **raw != Json::Null) else {
            continue;
        };
        let value = if field.is_list() {
            let Json::Array(items) = raw else {
                return Err(type_error(raw.kind(), "[]json.RawMessage"));
            };
            Value::List(
                items
                    .iter()
                    .map(|item| singular(item, &field, depth))
                    .collect::<Result<_, _>>()?,
            )
        } else {
            singular(raw, &field, depth)?
        };
        message
            .try_set_field(&field, value)
            .map_err(|e| e.to_string())?;
    }
    Ok(message)
}

/// jsonpb's `trimQuote`: a number may come as a string; its text (not unescaped) is then read
/// as JSON once more.
fn unquoted(json: &Json) -> Result<Json, String> {
    match json {
        Json::String { raw, .. } if raw.len() >= 2 => {
            gojson::parse(&raw.as_bytes()[1..raw.len() - 1])
        }
        other => Ok(other.clone()),
    }
}

/// A number of Go type `go_type`, from `json` as `json.Unmarshal` reads it (`null` is 0).
fn number<N: std::str::FromStr + Default>(json: &Json, go_type: &str) -> Result<N, String> {
    match json {
        Json::Null => Ok(N::default()),
        Json::Number(text) => text
            .parse()
            .map_err(|_| type_error(&format!("number {text}"), go_type)),
        other => Err(type_error(other.kind(), go_type)),
    }
}

fn singular(json: &Json, field: &FieldDescriptor, depth: usize) -> Result<Value, String> {
    Ok(match field.kind() {
        Kind::Bool => match json {
            Json::Bool(b) => Value::Bool(*b),
            Json::Null => Value::Bool(false),
            other => return Err(type_error(other.kind(), "bool")),
        },
        Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => {
            Value::I32(number(&unquoted(json)?, "int32")?)
        }
        Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => {
            Value::I64(number(&unquoted(json)?, "int64")?)
        }
        Kind::Uint32 | Kind::Fixed32 => Value::U32(number(&unquoted(json)?, "uint32")?),
        Kind::Uint64 | Kind::Fixed64 => Value::U64(number(&unquoted(json)?, "uint64")?),
        Kind::Float => Value::F32(number(&unquoted(json)?, "float32")?),
        Kind::Double => Value::F64(number(&unquoted(json)?, "float64")?),
        Kind::String => match json {
            Json::String { value, .. } => Value::String(value.clone()),
            Json::Null => Value::String(String::new()),
            other => return Err(type_error(other.kind(), "string")),
        },
        Kind::Bytes => Value::Bytes(bytes(json)?.into()),
        Kind::Enum(descriptor) => enum_value(json, &descriptor)?,
        Kind::Message(descriptor) => Value::Message(message(json, &descriptor, depth + 1)?),
    })
}

/// A `[]byte` as Go's `json.Unmarshal` reads it: standard base64 in a string, or an array of
/// byte values.
fn bytes(json: &Json) -> Result<Vec<u8>, String> {
    match json {
        Json::Null => Ok(Vec::new()),
        Json::String { value, .. } => go_base64(value.as_bytes()),
        Json::Array(items) => items.iter().map(|item| number(item, "uint8")).collect(),
        other => Err(type_error(other.kind(), "[]uint8")),
    }
}

/// An enum by name (`"ASCEND"`) or by any number, as jsonpb 1.4+ (etcd 3.5) words its errors:
/// `unknown value "\"FOO\"" for enum etcdserverpb.RangeRequest.SortOrder` and
/// `... into Go value of type protoreflect.EnumNumber` (etcd 3.4 says `"FOO"` and
/// `etcdserverpb.RangeRequest_SortOrder`).
fn enum_value(json: &Json, descriptor: &prost_reflect::EnumDescriptor) -> Result<Value, String> {
    if let Json::String { raw, .. } = json {
        let name = raw.get(1..raw.len().saturating_sub(1)).unwrap_or_default();
        return match descriptor.get_value_by_name(name) {
            Some(value) => Ok(Value::EnumNumber(value.number())),
            None => Err(format!(
                "unknown value {raw:?} for enum {}",
                descriptor.full_name()
            )),
        };
    }
    Ok(Value::EnumNumber(number(json, "protoreflect.EnumNumber")?))
}

/// Go's `base64.StdEncoding.Decode`, with its error offsets (`illegal base64 data at input
/// byte N`): padding required, `\r` and `\n` skipped, bits after the data not checked.
fn go_base64(src: &[u8]) -> Result<Vec<u8>, String> {
    fn value(c: u8) -> Option<u32> {
        Some(u32::from(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        }))
    }
    let corrupt = |at: usize| format!("illegal base64 data at input byte {at}");
    let skip_newlines = |mut at: usize| {
        while at < src.len() && matches!(src[at], b'\r' | b'\n') {
            at += 1;
        }
        at
    };
    let mut out = Vec::with_capacity(src.len() / 4 * 3);
    let mut si = 0;
    while si < src.len() {
        let mut quantum = [0u32; 4];
        let mut len = 4;
        let mut j = 0;
        while j < 4 {
            if si == src.len() {
                if j == 0 {
                    return Ok(out);
                }
                // A quantum cut short: padding was required.
                return Err(corrupt(si - j));
            }
            let c = src[si];
            si += 1;
            if let Some(v) = value(c) {
                quantum[j] = v;
                j += 1;
                continue;
            }
            if c == b'\n' || c == b'\r' {
                continue;
            }
            if c != b'=' || j < 2 {
                return Err(corrupt(si - 1));
            }
            if j == 2 {
                // "==" expected; the first '=' is read.
                si = skip_newlines(si);
                if si == src.len() {
                    return Err(corrupt(src.len()));
                }
                if src[si] != b'=' {
                    return Err(corrupt(si - 1));
                }
                si += 1;
            }
            si = skip_newlines(si);
            if si < src.len() {
                // Data after the padding.
                return Err(corrupt(si));
            }
            len = j;
            break;
        }
        let bits = quantum[0] << 18 | quantum[1] << 12 | quantum[2] << 6 | quantum[3];
        let decoded = [(bits >> 16) as u8, (bits >> 8) as u8, bits as u8];
        out.extend_from_slice(&decoded[..len - 1]);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use etcdrs_proto::etcdserverpb::{
        PutRequest, RangeRequest, RequestOp, TxnRequest, compare, range_request, request_op,
    };

    fn range(body: &str) -> Result<RangeRequest, String> {
        decode(&gojson::parse(body.as_bytes())?)
    }

    #[test]
    fn base64_offsets_are_gos() {
        assert_eq!(go_base64(b"Zm9v"), Ok(b"foo".to_vec()));
        assert_eq!(go_base64(b"Zm8="), Ok(b"fo".to_vec()));
        assert_eq!(go_base64(b"Zg=="), Ok(b"f".to_vec()));
        assert_eq!(go_base64(b"Zm\n9v"), Ok(b"foo".to_vec()));
        assert_eq!(go_base64(b""), Ok(vec![]));
        // etcd 3.4's answers to the same inputs.
        assert_eq!(
            go_base64(b"Zm9").unwrap_err(),
            "illegal base64 data at input byte 0"
        );
        assert_eq!(
            go_base64(b"Zm9v==").unwrap_err(),
            "illegal base64 data at input byte 4"
        );
        assert_eq!(
            go_base64(b"Zm 9v").unwrap_err(),
            "illegal base64 data at input byte 2"
        );
        assert_eq!(
            go_base64(b"%%%").unwrap_err(),
            "illegal base64 data at input byte 0"
        );
        assert_eq!(
            go_base64(b"Zg=").unwrap_err(),
            "illegal base64 data at input byte 3"
        );
        assert_eq!(
            go_base64(b"Zg==x").unwrap_err(),
            "illegal base64 data at input byte 4"
        );
    }

    #[test]
    fn fields_as_jsonpb_reads_them() {
        let r = range(
            r#"{"key":"Zm9v","limit":"5","sortOrder":"DESCEND","keys_only":true,"bogus":[1]}"#,
        )
        .expect("decodes");
        assert_eq!(r.key, b"foo");
        assert_eq!(r.limit, 5);
        assert_eq!(r.sort_order, range_request::SortOrder::Descend as i32);
        assert!(r.keys_only);
        // The JSON name wins over the proto name; the last of duplicate keys counts; null
        // leaves a field unset; any enum number is taken.
        let r = range(r#"{"keys_only":true,"keysOnly":false,"key":"YQ==","key":"Yg==","limit":null,"sort_order":7}"#)
            .expect("decodes");
        assert!(!r.keys_only);
        assert_eq!(r.key, b"b");
        assert_eq!(r.limit, 0);
        assert_eq!(r.sort_order, 7);
        assert_eq!(range("null"), Ok(RangeRequest::default()));
        assert_eq!(
            range(r#"{"key":[102,111,111]}"#).map(|r| r.key),
            Ok(b"foo".to_vec())
        );
    }

    #[test]
    fn wrong_types_get_gos_texts() {
        let e = |body: &str| range(body).expect_err(body);
        assert_eq!(
            e(r#"{"key":1}"#),
            "json: cannot unmarshal number into Go value of type []uint8"
        );
        assert_eq!(
            e(r#"{"limit":"abc"}"#),
            "invalid character 'a' looking for beginning of value"
        );
        assert_eq!(
            e(r#"{"limit":true}"#),
            "json: cannot unmarshal bool into Go value of type int64"
        );
        assert_eq!(
            e(r#"{"limit":"1.5"}"#),
            "json: cannot unmarshal number 1.5 into Go value of type int64"
        );
        assert_eq!(e(r#"{"limit":""}"#), "unexpected end of JSON input");
        assert_eq!(
            e(r#"{"limit":[1]}"#),
            "json: cannot unmarshal array into Go value of type int64"
        );
        assert_eq!(
            e(r#"{"limit":99999999999999999999}"#),
            "json: cannot unmarshal number 99999999999999999999 into Go value of type int64"
        );
        assert_eq!(
            e(r#"{"serializable":"true"}"#),
            "json: cannot unmarshal string into Go value of type bool"
        );
        assert_eq!(
            e(r#"{"key":[102,111,300]}"#),
            "json: cannot unmarshal number 300 into Go value of type uint8"
        );
        assert_eq!(
            e("[1]"),
            "json: cannot unmarshal array into Go value of type map[string]json.RawMessage"
        );
        assert_eq!(
            e(r#""abc""#),
            "json: cannot unmarshal string into Go value of type map[string]json.RawMessage"
        );
        assert_eq!(
            e(r#"{"sort_order":"FOO"}"#),
            r#"unknown value "\"FOO\"" for enum etcdserverpb.RangeRequest.SortOrder"#
        );
        assert_eq!(
            e(r#"{"sort_order":true}"#),
            "json: cannot unmarshal bool into Go value of type protoreflect.EnumNumber"
        );
        // Declaration order decides which error is reported: key (1) before limit (3).
        assert_eq!(
            e(r#"{"limit":true,"key":1}"#),
            "json: cannot unmarshal number into Go value of type []uint8"
        );
    }

    #[test]
    fn nested_messages_lists_and_oneofs() {
        let body = r#"{"compare":[{"key":"Zm9v","target":"VALUE","value":"YmFy","result":"EQUAL"}],
            "success":[{"request_put":{"key":"Zm9v","value":"YmFy"}},{"Request":{"RequestPut":{}}}]}"#;
        let txn: TxnRequest = decode(&gojson::parse(body.as_bytes()).expect("json")).expect("txn");
        assert_eq!(txn.compare.len(), 1);
        assert_eq!(txn.compare[0].target, compare::CompareTarget::Value as i32);
        assert_eq!(
            txn.compare[0].target_union,
            Some(compare::TargetUnion::Value(b"bar".to_vec()))
        );
        assert_eq!(
            txn.success,
            [
                RequestOp {
                    request: Some(request_op::Request::RequestPut(PutRequest {
                        key: b"foo".to_vec(),
                        value: b"bar".to_vec().into(),
                        ..Default::default()
                    }))
                },
                // Go's field names are not JSON names: an empty op, which the server refuses.
                RequestOp { request: None },
            ]
        );
        let e =
            decode::<TxnRequest>(&gojson::parse(br#"{"compare":{"key":"Zm9v"}}"#).expect("json"))
                .expect_err("not a list");
        assert_eq!(
            e,
            "json: cannot unmarshal object into Go value of type []json.RawMessage"
        );
    }
}
