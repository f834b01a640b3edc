//! Checks of single fields that every configuration source shares (files, the management
//! cluster's objects, Karmada Clusters): names, addresses, tokens, egress proxies. Pure functions
//! of their input; the message says what is wrong, the caller names the object and field.

/// Cluster names that would clash with gateway or Kubernetes paths in the OCM `/{name}/...` style.
pub const RESERVED_CLUSTER_NAMES: &[&str] = &[
    "clusters", "fleet", "apis", "api", "healthz", "readyz", "livez", "metrics", "version",
    "openapi",
];

pub(crate) fn check_address(addr: &str) -> Result<(), String> {
    addr.parse::<std::net::SocketAddr>()
        .map(|_| ())
        .map_err(|e| format!("{addr:?} is not an IP:port address: {e}"))
}

/// A bearer token goes into a header: non-empty printable ASCII without spaces.
pub(crate) fn check_token(token: &str) -> Result<(), String> {
    if token.is_empty() || token.bytes().any(|b| !(0x21..=0x7e).contains(&b)) {
        return Err("must be non-empty printable ASCII without spaces".into());
    }
    Ok(())
}

/// An egress proxy is an `http://` URL with a host (optionally `user:password@`): the gateway
/// opens an HTTP CONNECT tunnel through it. `https://` and `socks5://` proxies are refused here,
/// with that reason, rather than accepted and then failing on every request.
pub(crate) fn check_proxy_url(url: &str) -> Result<(), String> {
    let uri: http::Uri = url
        .parse()
        .map_err(|e| format!("{url:?} is not a URL: {e}"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https" | "socks5" | "socks5h") => {
            return Err(format!(
                "{url:?}: only http:// egress proxies (HTTP CONNECT) are supported, not {}://",
                uri.scheme_str().unwrap_or_default()
            ))
        }
        _ => return Err(format!("{url:?}: the scheme must be http")),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(format!("{url:?} has no host"));
    }
    if uri
        .path_and_query()
        .is_some_and(|p| p.as_str() != "/" && !p.as_str().is_empty())
    {
        return Err(format!("{url:?}: a proxy URL has no path or query"));
    }
    Ok(())
}

/// `proxyHeader`: header names and values the CONNECT request can carry, and only with a proxy.
pub(crate) fn check_proxy_headers(
    proxy_url: Option<&str>,
    headers: &std::collections::BTreeMap<String, String>,
) -> Result<(), String> {
    if !headers.is_empty() && proxy_url.is_none() {
        return Err("proxy headers need spec.proxyURL".into());
    }
    for (header, value) in headers {
        http::HeaderName::from_bytes(header.as_bytes())
            .map_err(|_| format!("{header:?} is not a header name"))?;
        http::HeaderValue::from_str(value)
            .map_err(|_| format!("the value of {header:?} is not a header value"))?;
    }
    Ok(())
}

/// A cluster name is a DNS-1123 label and not reserved.
pub fn check_cluster_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if !ok {
        return Err(format!(
            "{name:?} is not a DNS-1123 label (lower-case letters, digits, '-', at most 63)"
        ));
    }
    if RESERVED_CLUSTER_NAMES.contains(&name) {
        return Err(format!("{name:?} is reserved"));
    }
    Ok(())
}

/// A Kubernetes quantity of bytes (`512Mi`, `2Gi`, `1G`, `1048576`): a whole number with an
/// optional binary (`Ki` to `Ei`) or decimal (`k` to `E`) suffix. None for anything else
/// (fractions, exponents, signs, blanks) or a value past `u64`.
pub fn quantity_bytes(text: &str) -> Option<u64> {
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 || digits > 20 {
        return None;
    }
    let (number, suffix) = text.split_at(digits);
    let number: u64 = number.parse().ok()?;
    let scale: u64 = match suffix {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        "Ei" => 1 << 60,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "P" => 1_000_000_000_000_000,
        "E" => 1_000_000_000_000_000_000,
        _ => return None,
    };
    number.checked_mul(scale)
}

#[cfg(test)]
mod tests {
    use super::quantity_bytes;
    use proptest::prelude::*;

    #[test]
    fn quantities_of_bytes_read_as_kube_writes_them_and_nothing_else() {
        for (text, bytes) in [
            ("0", Some(0)),
            ("1048576", Some(1 << 20)),
            ("512Mi", Some(512 << 20)),
            ("2Gi", Some(2 << 30)),
            ("1G", Some(1_000_000_000)),
            ("3k", Some(3_000)),
            ("16Ei", None),
            ("15Ei", Some(15 << 60)),
            ("18446744073709551616", None),
            ("1.5Gi", None),
            ("1e9", None),
            ("-1Gi", None),
            ("+1Gi", None),
            (" 1Gi", None),
            ("1Gi ", None),
            ("1gi", None),
            ("1K", None),
            ("Gi", None),
            ("", None),
            ("1 Gi", None),
            ("1Gi\u{0}", None),
        ] {
            assert_eq!(quantity_bytes(text), bytes, "{text:?}");
        }
    }

    proptest! {
        #[test]
        fn any_text_is_read_or_refused_without_a_panic(text in ".{0,40}") {
            let _ = quantity_bytes(&text);
        }

        #[test]
        fn a_whole_number_of_mebibytes_reads_back(n in 0u64..(1 << 40)) {
            prop_assert_eq!(quantity_bytes(&format!("{n}Mi")), Some(n << 20));
        }
    }
}
