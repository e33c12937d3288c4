//! Kafka mechanics: the consumer's poll loop, offsets and rebalances ([`consumer`]), the offset
//! rule ([`offsets`]), the intake decisions ([`flow`]), the two lanes and the bound they share
//! ([`lanes`]), which fetched message goes first ([`ahead`]), the response producer
//! ([`producer`]), the client settings ([`client`]) and where the unit group starts
//! ([`handover`]). Nothing here touches pixels.

pub mod ahead;
pub mod client;
pub mod consumer;
pub mod flow;
pub mod handover;
pub mod lanes;
pub mod offsets;
pub mod producer;
pub mod settings;

pub use consumer::{Acker, Bound, Delivery, KafkaSource, Lane, LookAhead};
pub use producer::Publisher;
pub use settings::{GroupProtocol, KafkaSettings};
