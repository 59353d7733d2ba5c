//! Transport registry: scenario names -> transport constructors with config overrides.
//!
//! Adding a transport is one `register` line in [`Registry::builtin`].

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use hop_proto::{Transport, TransportId};

/// Builds one transport instance from the scenario's `[transports.NAME]` table.
pub type Factory = Box<dyn Fn(&toml::Table) -> Result<Box<dyn Transport>, String>>;

struct Entry {
    id: TransportId,
    factory: Factory,
}

/// Named transport constructors.
#[derive(Default)]
pub struct Registry {
    entries: BTreeMap<String, Entry>,
}

impl Registry {
    /// A registry with no transports (tests register their own).
    pub fn empty() -> Self {
        Self::default()
    }

    /// Every transport the project ships.
    pub fn builtin() -> Self {
        Self::empty()
    }

    /// Register (or replace) a transport under `name`.
    pub fn register(
        &mut self,
        name: &str,
        id: TransportId,
        f: impl Fn(&toml::Table) -> Result<Box<dyn Transport>, String> + 'static,
    ) {
        self.entries.insert(
            name.to_string(),
            Entry {
                id,
                factory: Box::new(f),
            },
        );
    }

    pub fn names(&self) -> Vec<String> {
        self.entries.keys().cloned().collect()
    }

    pub fn id_of(&self, name: &str) -> Option<TransportId> {
        self.entries.get(name).map(|e| e.id)
    }

    /// Build an instance of `name` with `overrides` applied.
    pub fn build(&self, name: &str, overrides: &toml::Table) -> Result<Box<dyn Transport>, String> {
        let e = self
            .entries
            .get(name)
            .ok_or_else(|| format!("unknown transport; known: {}", self.names().join(", ")))?;
        (e.factory)(overrides)
    }
}

/// Applies a TOML table onto config fields, then rejects keys nobody consumed.
pub struct Overrides<'a> {
    table: &'a toml::Table,
    used: BTreeSet<&'a str>,
}

impl<'a> Overrides<'a> {
    pub fn new(table: &'a toml::Table) -> Self {
        Overrides {
            table,
            used: BTreeSet::new(),
        }
    }

    fn get(&mut self, key: &'a str) -> Option<&'a toml::Value> {
        let v = self.table.get(key)?;
        self.used.insert(key);
        Some(v)
    }

    pub fn bool(&mut self, key: &'a str, field: &mut bool) -> Result<(), String> {
        if let Some(v) = self.get(key) {
            *field = v
                .as_bool()
                .ok_or_else(|| format!("{key} must be true or false"))?;
        }
        Ok(())
    }

    pub fn uint<T: TryFrom<i64>>(&mut self, key: &'a str, field: &mut T) -> Result<(), String> {
        if let Some(v) = self.get(key) {
            let i = v
                .as_integer()
                .ok_or_else(|| format!("{key} must be an integer"))?;
            *field = T::try_from(i).map_err(|_| format!("{key} = {i} is out of range"))?;
        }
        Ok(())
    }

    pub fn float(&mut self, key: &'a str, field: &mut f64) -> Result<(), String> {
        if let Some(v) = self.get(key) {
            *field = v
                .as_float()
                .or_else(|| v.as_integer().map(|i| i as f64))
                .ok_or_else(|| format!("{key} must be a number"))?;
        }
        Ok(())
    }

    /// A duration given in seconds (integer or float).
    pub fn secs(&mut self, key: &'a str, field: &mut Duration) -> Result<(), String> {
        if let Some(v) = self.get(key) {
            let s = v
                .as_float()
                .or_else(|| v.as_integer().map(|i| i as f64))
                .ok_or_else(|| format!("{key} must be a number of seconds"))?;
            *field = Duration::try_from_secs_f64(s)
                .map_err(|_| format!("{key} = {s} is not a valid duration in seconds"))?;
        }
        Ok(())
    }

    /// Error if the table holds a key that no field consumed.
    pub fn finish(self) -> Result<(), String> {
        let unknown: Vec<&str> = self
            .table
            .keys()
            .map(|k| k.as_str())
            .filter(|k| !self.used.contains(k))
            .collect();
        if unknown.is_empty() {
            Ok(())
        } else {
            Err(format!("unknown config key(s): {}", unknown.join(", ")))
        }
    }
}
