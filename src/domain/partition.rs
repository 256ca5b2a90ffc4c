//! The partition rule of the intake streams.
//!
//! With `ingest.partitions = 1` (the default) every event goes to the one stream
//! `ingest.stream`. With `N > 1` events go to `N` streams `<ingest.stream>:{0}` to
//! `<ingest.stream>:{N-1}`: the hash tag puts each partition in its own cluster slot
//! ([`partition_keys`]; distinct for every `N` up to [`MAX_PARTITIONS`]). An event goes to
//! partition `crc32(id) mod N`, CRC-32 (IEEE) of the event's `id` field as bytes
//! ([`partition_of`]), which any language's standard library computes in one line.
//! Exactly-once does not depend on the rule: duplicates are recognised per board instance,
//! so a copy of an event on another partition is still a duplicate.

/// Most partitions `ingest.partitions` may name.
pub const MAX_PARTITIONS: usize = 64;

/// The stream key of partition `index` of `partitions`: `stream` itself when there is one
/// partition, else `<stream>:{<index>}`.
pub fn partition_key(stream: &str, partitions: usize, index: usize) -> String {
    if partitions <= 1 {
        stream.to_string()
    } else {
        format!("{stream}:{{{index}}}")
    }
}

/// Every partition's stream key, in partition order.
pub fn partition_keys(stream: &str, partitions: usize) -> Vec<String> {
    (0..partitions.max(1))
        .map(|i| partition_key(stream, partitions, i))
        .collect()
}

/// The partition an event with this `id` goes to: CRC-32 (IEEE) of the id's bytes,
/// modulo `partitions`.
pub fn partition_of(id: &[u8], partitions: usize) -> usize {
    (crc32fast::hash(id) % partitions.max(1) as u32) as usize
}

/// Stream keys of the other layouts (other partition counts) that a daemon configured
/// with `partitions` does not read as its own: the bare stream when partitioned, and
/// partitions `partitions..MAX_PARTITIONS` (all of them with one partition). Entries left
/// there by a change of `ingest.partitions` are drained by the consumer.
pub fn retired_keys(stream: &str, partitions: usize) -> Vec<String> {
    let mut keys = Vec::new();
    if partitions > 1 {
        keys.push(stream.to_string());
    }
    let first = if partitions > 1 { partitions } else { 0 };
    keys.extend((first..MAX_PARTITIONS).map(|i| partition_key(stream, MAX_PARTITIONS, i)));
    keys
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn one_partition_is_the_configured_stream() {
        assert_eq!(partition_keys("rb:events", 1), ["rb:events"]);
        assert_eq!(partition_of(b"anything", 1), 0);
        assert_eq!(
            partition_keys("rb:events", 3),
            ["rb:events:{0}", "rb:events:{1}", "rb:events:{2}"]
        );
    }

    #[test]
    fn partitions_sit_in_distinct_cluster_slots() {
        for n in 2..=MAX_PARTITIONS {
            let slots: HashSet<u16> = partition_keys("rb:events", n)
                .iter()
                .map(|k| fred::util::redis_keyslot(k.as_bytes()))
                .collect();
            assert_eq!(slots.len(), n, "{n} partitions share a slot");
        }
    }

    #[test]
    fn the_rule_is_crc32_ieee_of_the_id_modulo_n() {
        // Check values of CRC-32 (IEEE): "123456789" is the standard check input.
        assert_eq!(crc32fast::hash(b"123456789"), 0xCBF4_3926);
        assert_eq!(partition_of(b"123456789", 3), (0xCBF4_3926u32 % 3) as usize);
        assert_eq!(
            partition_of(b"tip-1", 7),
            (crc32fast::hash(b"tip-1") % 7) as usize
        );
        // Every partition gets events.
        let hit: HashSet<usize> = (0..1000)
            .map(|i| partition_of(format!("tip-{i}").as_bytes(), 16))
            .collect();
        assert_eq!(hit.len(), 16);
    }

    #[test]
    fn retired_keys_are_the_other_layouts() {
        let one = retired_keys("s", 1);
        assert_eq!(one.len(), MAX_PARTITIONS);
        assert_eq!(one[0], "s:{0}");
        let three = retired_keys("s", 3);
        assert_eq!(three[0], "s");
        assert_eq!(three[1], "s:{3}");
        assert!(!three.contains(&"s:{2}".to_string()));
        assert_eq!(three.len(), 1 + MAX_PARTITIONS - 3);
    }
}
