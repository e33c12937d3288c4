//! Kafka mechanics: the consumer's poll loop, offsets and rebalances ([`consumer`]), the offset
//! rule ([`offsets`]), the intake decisions ([`flow`]), the response producer ([`producer`]), the client settings
//! ([`client`]) and where the unit group starts ([`handover`]). Nothing here touches pixels.

pub mod client;
pub mod consumer;
pub mod flow;
pub mod handover;
pub mod offsets;
pub mod producer;
pub mod settings;

pub use consumer::{Acker, Bound, Delivery, KafkaSource, Lane};
pub use producer::Publisher;
pub use settings::{GroupProtocol, KafkaSettings};
