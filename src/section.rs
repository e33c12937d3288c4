//! A configuration section checks itself beside its definition (`kafka::settings`,
//! `media::settings`, `scan::settings`, …): `config` only loads the layers, mounts the
//! sections and checks the rules that span two of them. A section names a bad key relative to
//! itself (`progress_step`); `config` adds where it is mounted (`kafka.progress_step`), so a
//! section does not know the file it is read from.

/// A value a section refuses, with its key (empty: the section as a whole).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid value for key `{key}`: {message}")]
pub struct Invalid {
    pub key: String,
    pub message: String,
}

impl Invalid {
    pub fn new(key: impl Into<String>, message: impl Into<String>) -> Invalid {
        Invalid {
            key: key.into(),
            message: message.into(),
        }
    }

    /// The same problem seen from where the section is mounted: `progress_step` within
    /// `kafka` is `kafka.progress_step`.
    pub fn within(self, section: &str) -> Invalid {
        let key = match self.key.as_str() {
            "" => section.to_owned(),
            key => format!("{section}.{key}"),
        };
        Invalid { key, ..self }
    }
}

/// `Ok` when `ok`, else `key` refused with `message`.
pub fn ensure(ok: bool, key: &str, message: impl Into<String>) -> Result<(), Invalid> {
    if ok {
        Ok(())
    } else {
        Err(Invalid::new(key, message))
    }
}

/// A section of the settings that can tell a bad value on its own.
pub trait Section {
    fn validate(&self) -> Result<(), Invalid>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_named_from_where_its_section_is_mounted() {
        let e = Invalid::new("widths", "need one").within("profiles.small");
        assert_eq!(
            e.to_string(),
            "invalid value for key `profiles.small.widths`: need one"
        );
        assert_eq!(Invalid::new("", "bad").within("limits").key, "limits");
        assert_eq!(ensure(true, "k", "m"), Ok(()));
    }
}
