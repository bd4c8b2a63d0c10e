//! Whether a name (an environment variable's, a key's, a flag's) names a credential, judged
//! by its words: the one reading behind what a stdio MCP server inherits (`envInherit:
//! safe`) and which values toolmux redacts.
//!
//! ```
//! use toolmux_core::credential::is_credential_name;
//!
//! assert!(is_credential_name("GITHUB_TOKEN"));
//! assert!(is_credential_name("apiKey"));
//! assert!(!is_credential_name("TOKENIZER_PATH"));
//! assert!(!is_credential_name("MONKEY"));
//! ```

/// Whether `name` has a word that names a credential ([`is_credential_word`]), its words
/// split as [`words`] splits them, never by its text: `GITHUB_TOKEN`, `GITHUBTOKEN`,
/// `OPENAI_API_KEY`, `APIKEY`, `apiKey`, `X-Api-Key`, `PGPASSWORD`, `GH_PAT` and
/// `XAUTHORITY` do, while `MONKEY`, `BYPASS`, `TOKENIZER_PATH` and `KEYBOARD_LAYOUT` hold
/// `KEY`, `PASS` and `TOKEN` without naming one.
pub fn is_credential_name(name: &str) -> bool {
    words(name).any(|word| is_credential_word(&word))
}

/// The words of a name, upper case: split at anything but an ASCII letter (`_`, `-`, `.`,
/// digits), and where a lower-case letter is followed by a capital (`apiKey`). Digits
/// split, so `S3PWD` and `TOKEN2` hold the words `PWD` and `TOKEN`.
pub fn words(name: &str) -> impl Iterator<Item = String> + '_ {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut previous_lower = false;
    for c in name.chars() {
        if !c.is_ascii_alphabetic() || (c.is_ascii_uppercase() && previous_lower) {
            words.push(std::mem::take(&mut word));
        }
        previous_lower = c.is_ascii_lowercase();
        if c.is_ascii_alphabetic() {
            word.push(c.to_ascii_uppercase());
        }
    }
    words.push(word);
    words.into_iter().filter(|word| !word.is_empty())
}

/// Whether a word (upper case, as [`words`] gives it) names a credential: one of
/// `CREDENTIAL_WORDS`, one ending in one of `CREDENTIAL_COMPOUNDS` (`PHPSESSIONID`,
/// `XAUTHORITY`), or one ending in `TOKEN`, `SECRET`, `PASSWORD`, `PASSWD` or `AUTH`
/// (`GITHUBTOKEN`, `PGPASSWORD`, `BASICAUTH`), endings no ordinary word has, or in `KEY`
/// unless it is one of the ordinary words of `ORDINARY_KEY_WORDS` (`GOOGLEAPIKEY`,
/// `SSHKEY`, but not `MONKEY`). `PASS` counts only as a whole word, as so many words end
/// in it. Digits at its end are passed over (`TOKEN2`, `KEY1`), as a number after the
/// word tells credentials apart.
pub fn is_credential_word(word: &str) -> bool {
    let word = word.trim_end_matches(|c: char| c.is_ascii_digit());
    CREDENTIAL_WORDS.contains(&word)
        || CREDENTIAL_COMPOUNDS.iter().any(|compound| word.ends_with(compound))
        || ["TOKEN", "SECRET", "PASSWORD", "PASSWD", "AUTH"].iter().any(|end| word.ends_with(end))
        || (word.ends_with("KEY") && !ORDINARY_KEY_WORDS.contains(&word))
}

/// Words that name a credential in a variable's or a key's name. `PAT` is GitHub's
/// personal access token (`GH_PAT`): as a whole word it names nothing else in a variable.
/// `SESSION` stays, as a session's identifier lets whoever holds it in.
const CREDENTIAL_WORDS: [&str; 24] = [
    "TOKEN",
    "SECRET",
    "SECRETS",
    "PASSWORD",
    "PASSWORDS",
    "PASSWD",
    "PASS",
    "PASSPHRASE",
    "PWD",
    "PW",
    "KEY",
    "KEYS",
    "AUTH",
    "AUTHORIZATION",
    "CREDENTIAL",
    "CREDENTIALS",
    "CREDS",
    "COOKIE",
    "COOKIES",
    "SESSION",
    "PRIVATE",
    "BEARER",
    "PAT",
    "JWT",
];

/// Credentials' names written as one word (`OPENWEATHER_APIKEY`, `clientsecret`), and as
/// the end of one (`GOOGLEAPIKEY`, `PHPSESSIONID`); those ending in `TOKEN`, `SECRET`,
/// `AUTH` or `KEY` need no entry ([`is_credential_word`]) but say what the list is for.
/// `XAUTHORITY` and `ICEAUTHORITY` name the X11 and ICE cookie files, which let whoever
/// reads them into the user's display and session.
const CREDENTIAL_COMPOUNDS: [&str; 15] = [
    "APIKEY",
    "APIKEYS",
    "PRIVATEKEY",
    "ACCESSKEY",
    "SECRETKEY",
    "AUTHKEY",
    "SESSIONKEY",
    "SIGNINGKEY",
    "ENCRYPTIONKEY",
    "MASTERKEY",
    "SESSIONID",
    "PASSCODE",
    "PASSKEY",
    "XAUTHORITY",
    "ICEAUTHORITY",
];

/// Ordinary words that end in `KEY` and name no credential: every other word that ends
/// in it (`SSHKEY`, `MAPBOXKEY`) is taken as one, as credentials are named so far more
/// often than variables are named after monkeys.
const ORDINARY_KEY_WORDS: [&str; 14] = [
    "MONKEY", "DONKEY", "TURKEY", "HOCKEY", "JOCKEY", "WHISKEY", "LACKEY", "MALARKEY", "FLUNKEY",
    "HOTKEY", "TURNKEY", "SMOKEY", "POKEY", "HOKEY",
];

#[cfg(test)]
mod tests {
    use super::*;

    /// A name names a credential by its words (split at `_`, `-`, `.`, digits and case
    /// changes) or a credential's name written as one word, never by a part of a word.
    #[test]
    fn credential_names_by_their_words() {
        for secret in [
            "API_KEY",
            "apiKey",
            "X-Api-Key",
            "x-api-key",
            "GITHUB_TOKEN",
            "GITHUBTOKEN",
            "APIKEY",
            "GH_PAT",
            "DB_PASSWORD",
            "dbPw",
            "MYSQL_PWD",
            "PGPASSWORD",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_SESSION_TOKEN",
            "OPENAI_API_KEY",
            "OPENWEATHER_APIKEY",
            "SESSION_COOKIE",
            "BEARER",
            "GPG_PASSPHRASE",
            "clientSecret",
            "AZURE_CLIENTSECRET",
            "SLACK_AUTHTOKEN",
            "githubtoken",
            "npm_config__authToken",
            "DEPLOY_PRIVATEKEY",
            "aws.accessKey",
            "JWT",
            "GOOGLE_APPLICATION_CREDENTIALS",
            "REGISTRY_AUTH",
            "SECRET_KEY_2",
            "TOKEN2",
            "S3_SECRET",
            "GOOGLEAPIKEY",
            "GOOGLEAPIKEYS",
            "OPENAIAPIKEY",
            "MAPBOXKEY",
            "SSHKEY",
            "STRIPESECRETKEY",
            "SSHKEY2",
            "PHPSESSIONID",
            "XAUTHORITY",
            "ICEAUTHORITY",
            "BASICAUTH",
            "ProxyBasicAuth",
            "SSH_AUTH_SOCK",
            "DBUS_SESSION_BUS_ADDRESS",
            // Digits split words: a credential's word after one is still a word.
            "S3PWD",
            "MY2PASS",
            "TOKEN2X",
        ] {
            assert!(is_credential_name(secret), "{secret} names a credential");
        }
        for plain in [
            "BYPASS",
            "BYPASS_PROXY",
            "MONKEY",
            "DONKEY_KONG",
            "KEYBOARD_LAYOUT",
            "PASSAGE_DIR",
            "TOKENIZER_PATH",
            "AUTHOR_NAME",
            "OLDPWD",
            "KEYSPACE",
            "COMPASS_HOME",
            "HOTKEY",
            "TURKEY",
            "HOCKEY",
            "JOCKEY",
            "DONKEY",
            "WHISKEY",
            "maxTokens",
            "PASSENGER_ENV",
            "PATH",
        ] {
            assert!(!is_credential_name(plain), "{plain} names no credential");
        }
    }

    #[test]
    fn words_split_at_punctuation_digits_and_case() {
        let split = |name| words(name).collect::<Vec<_>>().join(" ");
        assert_eq!(split("x-api-key"), "X API KEY");
        assert_eq!(split("npm_config__authToken"), "NPM CONFIG AUTH TOKEN");
        assert_eq!(split("aws.accessKey"), "AWS ACCESS KEY");
        assert_eq!(split("S3PWD"), "S PWD");
        assert_eq!(split("oauth2Token"), "OAUTH TOKEN");
        assert_eq!(split("__"), "");
    }

    #[test]
    fn a_number_after_a_word_is_passed_over() {
        assert!(is_credential_word("TOKEN2"));
        assert!(is_credential_word("KEY1"));
        assert!(!is_credential_word("MONKEY2"));
        assert!(!is_credential_word("PASSAGE"));
    }
}
