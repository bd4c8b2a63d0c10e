//! `private_key_jwt` client authentication (RFC 7523 §2.2): a short-lived assertion signed
//! with the client's key, ES256 or RS256.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::rand::SystemRandom;
use ring::signature::{self, EcdsaKeyPair, RsaKeyPair};
use serde_json::json;
use std::time::{SystemTime, UNIX_EPOCH};

use super::OAuthError;

/// A signing key read from PEM.
#[derive(Debug)]
pub(crate) enum SigningKey {
    Es256(EcdsaKeyPair),
    Rs256(RsaKeyPair),
}

impl SigningKey {
    /// Reads a PKCS#8 `PRIVATE KEY` PEM for `algorithm` (`ES256` or `RS256`).
    pub(crate) fn from_pem(pem: &str, algorithm: &str) -> Result<SigningKey, OAuthError> {
        let der = pkcs8_der(pem)?;
        let unreadable = |e: &dyn std::fmt::Display| {
            OAuthError::failed(format!("`oauth.privateKey` is not a {algorithm} PKCS#8 key ({e})"))
        };
        match algorithm {
            "ES256" => EcdsaKeyPair::from_pkcs8(
                &signature::ECDSA_P256_SHA256_FIXED_SIGNING,
                &der,
                &SystemRandom::new(),
            )
            .map(SigningKey::Es256)
            .map_err(|e| unreadable(&e)),
            "RS256" => {
                RsaKeyPair::from_pkcs8(&der).map(SigningKey::Rs256).map_err(|e| unreadable(&e))
            }
            other => Err(OAuthError::failed(format!(
                "`oauth.signingAlgorithm` is `{other}`; toolmux signs with ES256 or RS256"
            ))),
        }
    }

    fn algorithm(&self) -> &'static str {
        match self {
            SigningKey::Es256(_) => "ES256",
            SigningKey::Rs256(_) => "RS256",
        }
    }

    /// A client assertion from `client_id` for `audience`, valid for five minutes.
    pub(crate) fn assertion(&self, client_id: &str, audience: &str) -> Result<String, OAuthError> {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let header = json!({"alg": self.algorithm(), "typ": "JWT"});
        let claims = json!({
            "iss": client_id,
            "sub": client_id,
            "aud": audience,
            "iat": now,
            "exp": now + 300,
            "jti": super::random_token()?,
        });
        let signing_input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let rng = SystemRandom::new();
        let failed = |_| OAuthError::failed("signing the client assertion failed");
        let signature = match self {
            SigningKey::Es256(key) => {
                key.sign(&rng, signing_input.as_bytes()).map_err(failed)?.as_ref().to_vec()
            }
            SigningKey::Rs256(key) => {
                let mut signature = vec![0; key.public().modulus_len()];
                key.sign(
                    &signature::RSA_PKCS1_SHA256,
                    &rng,
                    signing_input.as_bytes(),
                    &mut signature,
                )
                .map_err(failed)?;
                signature
            }
        };
        Ok(format!("{signing_input}.{}", URL_SAFE_NO_PAD.encode(signature)))
    }
}

/// The DER inside a `-----BEGIN PRIVATE KEY-----` block.
fn pkcs8_der(pem: &str) -> Result<Vec<u8>, OAuthError> {
    let pem = pem.trim();
    if pem.contains("BEGIN EC PRIVATE KEY") || pem.contains("BEGIN RSA PRIVATE KEY") {
        return Err(OAuthError::failed(
            "`oauth.privateKey` is a SEC1/PKCS#1 key; convert it to PKCS#8 with \
             `openssl pkcs8 -topk8 -nocrypt -in key.pem -out key-pkcs8.pem`",
        ));
    }
    let body = pem
        .strip_prefix("-----BEGIN PRIVATE KEY-----")
        .and_then(|rest| rest.split("-----END PRIVATE KEY-----").next())
        .ok_or_else(|| {
            OAuthError::failed(
                "`oauth.privateKey` is not a PEM `PRIVATE KEY` block (-----BEGIN PRIVATE KEY----- ...)",
            )
        })?;
    let base64: String = body.chars().filter(|c| !c.is_whitespace()).collect();
    base64::engine::general_purpose::STANDARD.decode(base64).map_err(|e| {
        OAuthError::failed(format!("`oauth.privateKey`'s PEM body is not base64 ({e})"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn es256_assertions_verify() {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&signature::ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
            .expect("key");
        let pem = format!(
            "-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----\n",
            base64::engine::general_purpose::STANDARD.encode(pkcs8.as_ref())
        );
        let key = SigningKey::from_pem(&pem, "ES256").expect("read");
        let jwt = key.assertion("client-1", "https://as.example.com").expect("sign");
        let parts: Vec<&str> = jwt.split('.').collect();
        assert_eq!(parts.len(), 3);
        let claims: serde_json::Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[1]).expect("b64")).expect("json");
        assert_eq!(claims["iss"], "client-1");
        assert_eq!(claims["sub"], "client-1");
        assert_eq!(claims["aud"], "https://as.example.com");
        let SigningKey::Es256(pair) = &key else { panic!("es256") };
        use ring::signature::KeyPair;
        let public = signature::UnparsedPublicKey::new(
            &signature::ECDSA_P256_SHA256_FIXED,
            pair.public_key().as_ref(),
        );
        let signature = URL_SAFE_NO_PAD.decode(parts[2]).expect("b64");
        public
            .verify(format!("{}.{}", parts[0], parts[1]).as_bytes(), &signature)
            .expect("the signature verifies");
    }

    #[test]
    fn bad_keys_are_named() {
        let error = SigningKey::from_pem(
            "-----BEGIN EC PRIVATE KEY-----\nAAAA\n-----END EC PRIVATE KEY-----",
            "ES256",
        )
        .expect_err("sec1");
        assert!(error.to_string().contains("openssl pkcs8"), "{error}");
        let error = SigningKey::from_pem("hello", "ES256").expect_err("not pem");
        assert!(error.to_string().contains("not a PEM"), "{error}");
        let error = SigningKey::from_pem(
            "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----",
            "HS256",
        )
        .expect_err("alg");
        assert!(error.to_string().contains("ES256 or RS256"), "{error}");
    }
}
