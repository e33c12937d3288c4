//! Long videos as units of work (issue 45): a video past a duration threshold is planned as
//! units of consecutive whole segments, each unit a short media job over a time range, spread
//! over the fleet and stitched into the outputs a one-run encode makes. Only the plan exists
//! so far ([`plan`]); nothing calls it yet, and the one-run ladder (`media::video`) is what
//! every video takes.
//!
//! The protocol this room is for (a design, not yet built):
//!
//! - **Plan.** The worker that takes a request probes the source's frame timestamps (ffprobe,
//!   presentation order) and cuts them with [`plan::plan`] on the segment grid of the profile's
//!   `segment_secs`, `segments_per_unit` segments a unit (tests/streaming.rs checks that such
//!   a plan, one segment a unit, is where today's one run cuts a constant-rate source). A
//!   stream's rungs are brought to a constant rate before the cut (`transcode::Streaming`), so
//!   for a variable-rate source the frames to plan are those of the constant-rate timeline,
//!   not the source's. The plan depends on the source version (ETag), the profile fingerprint
//!   and the encoder build only, and is stored under a key derived from them
//!   (`{user_id}/videos/{media_id}/units/{plan_id}/plan.json`), so a redelivered request finds
//!   the same plan and the same landed units.
//! - **Units.** A unit decodes its range and encodes every rung with an IDR and a closed GOP on
//!   its first frame and exactly its frames, cut into segments carrying their global numbers
//!   (`Unit::first_segment`), the keys a one-run encode would write; then it writes its record
//!   (`units/{plan_id}/{index}.json`, the segments' measured durations and sizes) after its
//!   outputs have landed. A unit whose record exists is never encoded again, on any worker.
//!   Unit tasks ride a topic of their own, keyed by `{plan_id}/{index}` so that one video's
//!   units spread over the partitions, consumed by the same group.
//! - **Who waits.** Nobody holds a CPU permit while waiting: the request's job ends once the
//!   plan and its unit tasks are durably produced (its offset then commits, so a crash does not
//!   redo the partition behind it), and the worker that lands a plan's last missing unit does
//!   the stitch (playlists, MPD, MP4s assembled from the units, storyboard) and publishes the
//!   one response. A unit task lost or stuck is found by the plan's deadline and re-issued.
//!   Still open: exactly one response when two workers land the last units at once (a
//!   conditional create of a `done` marker before publishing), and audio, loudness and the
//!   poster once for the whole video (a unit of their own).

pub mod plan;
