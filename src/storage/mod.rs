//! Object storage behind one interface: S3 (any S3-compatible server) for the worker, the local
//! file system for `demo` and `process`.

mod interface;
mod local;
mod s3;
mod settings;

pub use interface::{Created, Head, ObjectMeta, SourceObject, Storage, StorageError};
pub use local::LocalStorage;
pub use s3::{S3Storage, http_client as s3_http_client};
pub use settings::StorageSettings;
