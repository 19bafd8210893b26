//! Who is on the other end of a connection: [`PeerInfo`], and the subject
//! of a verified client certificate as an RFC 4514 string.

use std::net::SocketAddr;

use x509_parser::asn1_rs::ToDer;
use x509_parser::oid_registry::Oid;
use x509_parser::x509::{AttributeTypeAndValue, X509Name};

/// The peer of one accepted connection, plaintext or TLS (the contract is
/// in the [module docs](super)). A request extension on every endpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerInfo {
    /// The client's address (`None` when the socket could not say).
    pub remote_addr: Option<SocketAddr>,
    /// The subject of the client certificate the client CA verified, as
    /// RFC 4514 ([`subject_rfc4514`]), e.g. `CN=worker-a,O=Acme`; `None`
    /// for plaintext, and for TLS without a client certificate.
    pub client_cert_subject: Option<String>,
}

/// The subject of the DER certificate `der` as an RFC 4514 string, or
/// `None` when it does not parse.
///
/// The format (RFC 4514 section 2): the RDNs in reverse order of their
/// encoding (the most specific first, so `CN=…` leads), joined by `,`
/// without spaces; the attributes of a multi-valued RDN joined by `+`.
/// Types with an RFC 4514 short name (`CN`, `L`, `ST`, `O`, `OU`, `C`,
/// `STREET`, `DC`, `UID`) are written with it and their string value
/// escaped (`\` before `,` `+` `"` `\` `<` `>` `;`, a leading `#` or space,
/// a trailing space; `\00` for NUL); any other type, or a value that is not
/// a string, is written as the dotted OID and `#` with the hex of the
/// value's DER encoding (e.g. `1.2.840.113549.1.9.1=#160f…` for an email
/// address).
pub fn subject_rfc4514(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    Some(name_rfc4514(cert.subject()))
}

fn name_rfc4514(name: &X509Name<'_>) -> String {
    let rdns: Vec<String> = name
        .iter()
        .map(|rdn| {
            rdn.iter()
                .map(attribute_rfc4514)
                .collect::<Vec<_>>()
                .join("+")
        })
        .collect();
    rdns.into_iter().rev().collect::<Vec<_>>().join(",")
}

fn attribute_rfc4514(atv: &AttributeTypeAndValue<'_>) -> String {
    let oid = atv.attr_type();
    match (short_name(oid), atv.as_str()) {
        (Some(name), Ok(value)) => format!("{name}={}", escape(value)),
        _ => {
            let der = atv.attr_value().to_der_vec().unwrap_or_default();
            format!("{}=#{}", oid.to_id_string(), hex::encode(der))
        }
    }
}

/// RFC 4514 section 3's short names.
fn short_name(oid: &Oid<'_>) -> Option<&'static str> {
    Some(match oid.to_id_string().as_str() {
        "2.5.4.3" => "CN",
        "2.5.4.7" => "L",
        "2.5.4.8" => "ST",
        "2.5.4.10" => "O",
        "2.5.4.11" => "OU",
        "2.5.4.6" => "C",
        "2.5.4.9" => "STREET",
        "0.9.2342.19200300.100.1.25" => "DC",
        "0.9.2342.19200300.100.1.1" => "UID",
        _ => return None,
    })
}

/// RFC 4514 section 2.4's escaping of a string value.
fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    let last = value.chars().count().saturating_sub(1);
    for (i, c) in value.chars().enumerate() {
        match c {
            ',' | '+' | '"' | '\\' | '<' | '>' | ';' => {
                out.push('\\');
                out.push(c);
            }
            '#' if i == 0 => out.push_str("\\#"),
            ' ' if i == 0 || i == last => out.push_str("\\ "),
            '\0' => out.push_str("\\00"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert_with(dn: rcgen::DistinguishedName) -> Vec<u8> {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        params.distinguished_name = dn;
        let key = rcgen::KeyPair::generate().expect("key");
        params.self_signed(&key).expect("cert").der().to_vec()
    }

    #[test]
    fn the_subject_is_most_specific_first_without_spaces() {
        let mut dn = rcgen::DistinguishedName::new();
        dn.push(rcgen::DnType::CountryName, "DE");
        dn.push(rcgen::DnType::OrganizationName, "Acme");
        dn.push(rcgen::DnType::CommonName, "worker-a");
        let subject = subject_rfc4514(&cert_with(dn)).expect("parses");
        assert_eq!(subject, "CN=worker-a,O=Acme,C=DE");
    }

    #[test]
    fn special_characters_are_escaped_and_unknown_types_are_hex() {
        let mut dn = rcgen::DistinguishedName::new();
        dn.push(rcgen::DnType::OrganizationName, "Acme, Inc.");
        dn.push(rcgen::DnType::CommonName, " #a+b ");
        dn.push(
            rcgen::DnType::CustomDnType(vec![1, 2, 840, 113549, 1, 9, 1]),
            rcgen::DnValue::Ia5String("a@b.c".try_into().expect("ia5")),
        );
        let subject = subject_rfc4514(&cert_with(dn)).expect("parses");
        assert_eq!(
            subject,
            "1.2.840.113549.1.9.1=#16056140622e63,CN=\\ #a\\+b\\ ,O=Acme\\, Inc."
        );
    }

    #[test]
    fn garbage_is_no_subject() {
        assert_eq!(subject_rfc4514(b"not a certificate"), None);
    }
}
