//! The Redis layout, spelled out once (docs/design.md, "Redis layout"): the exact keys the
//! crate's key schema makes under the default settings, through the helpers of
//! `support/keys.rs` every other test builds its keys with. A change of the layout breaks
//! this test, not the tests that only follow it.

use rollboard::domain::board::period_instance;

use crate::support::keys::{
    base, dead_letter_stream, instance, instance_in, intake_stream, partition_stream, prefix,
    records_prefix, schema, scoped_prefix, shard, under,
};

#[test]
fn the_keys_tests_build_are_the_documented_layout() {
    assert_eq!(prefix(), "rb");

    // An unscoped board: every key under the hash tag `{board}`.
    let rooms = instance("rooms", None);
    for (key, expected) in [
        (rooms.result(), "rb:{rooms}:result"),
        (rooms.members(), "rb:{rooms}:members"),
        (rooms.ranked(), "rb:{rooms}:ranked"),
        (rooms.slices(), "rb:{rooms}:slices"),
        (rooms.meta(), "rb:{rooms}:meta"),
        (rooms.seen(), "rb:{rooms}:seen"),
        (rooms.seen_table(), "rb:{rooms}:seen:ids"),
        (rooms.seen_log(490_000), "rb:{rooms}:seen:490000"),
        (rooms.refs(), "rb:{rooms}:refs"),
        (rooms.totals(), "rb:{rooms}:totals"),
        (rooms.dense(), "rb:{rooms}:dense"),
        (rooms.slice(490_000), "rb:{rooms}:slice:490000"),
        (
            rooms.scratch("18f00d", "result"),
            "rb:{rooms}:tmp:18f00d:result",
        ),
        (rooms.changes(), "rb:changes:{rooms}"),
        (base(&rooms), "rb:{rooms}"),
        (under(&rooms, "tmp:*"), "rb:{rooms}:tmp:*"),
    ] {
        assert_eq!(key, expected);
    }

    // A scoped board: the scope inside the tag, whatever it holds.
    let fans = instance("fans_7d", Some("room42"));
    assert_eq!(fans.result(), "rb:{fans_7d:room42}:result");
    assert_eq!(fans.slice(7), "rb:{fans_7d:room42}:slice:7");
    assert_eq!(fans.changes(), "rb:changes:{fans_7d:room42}");
    assert_eq!(instance("tips", Some("d}e")).refs(), "rb:{tips:d}e}:refs");
    assert_eq!(instance("tips", Some("a:b")).meta(), "rb:{tips:a:b}:meta");
    assert_eq!(scoped_prefix("tips"), "rb:{tips:");

    // A shard is an instance named `#<n>`; a period an instance named `@<id>`.
    assert_eq!(shard(3), "#3");
    assert_eq!(
        instance("rooms_7d", Some(&shard(3))).result(),
        "rb:{rooms_7d:#3}:result"
    );
    assert_eq!(
        instance("tips_month", Some(&period_instance(None, "2026-11"))).result(),
        "rb:{tips_month:@2026-11}:result"
    );

    // A narrower window: `w:<width>` after the tag; its feed `:<width>` after the feed's.
    let day = instance_in("rooms", None, "1d");
    assert_eq!(day.result(), "rb:{rooms}:w:1d:result");
    assert_eq!(day.slice(7), "rb:{rooms}:w:1d:slice:7");
    assert_eq!(day.changes(), "rb:changes:{rooms}:1d");
    assert_eq!(base(&day), "rb:{rooms}:w:1d");
    assert_eq!(
        instance_in("tips", Some("r1"), "2h").meta(),
        "rb:{tips:r1}:w:2h:meta"
    );
    assert_eq!(
        schema().changes("fans", Some("room42"), Some("7d")),
        "rb:changes:{fans:room42}:7d"
    );

    // The board-level records, outside every instance's tag.
    let keys = schema();
    assert_eq!(keys.scopes("fans_7d"), "rb:board:fans_7d:scopes");
    assert_eq!(keys.settings("fans_7d"), "rb:board:fans_7d:settings");
    assert_eq!(keys.window("fans_7d"), "rb:board:fans_7d:window");
    assert_eq!(keys.periods("fans_7d"), "rb:board:fans_7d:periods");
    assert_eq!(records_prefix("fans_7d"), "rb:board:fans_7d:");
    assert_eq!(
        keys.board_patterns("tips"),
        [
            "rb:{tips}:*",
            "rb:{tips:*",
            "rb:changes:{tips}",
            "rb:changes:{tips}:*",
            "rb:changes:{tips:*",
        ]
    );

    // The jobs' leases and the key a WAIT follows.
    assert_eq!(keys.lease("roll"), "rb:job:{roll}:lease");
    assert_eq!(keys.lease_tick("roll"), "rb:job:{roll}:tick");
    assert_eq!(keys.sync(Some("3")), "rb:sync:{3}");

    // The intake streams of the default settings.
    assert_eq!(intake_stream(), "rb:events");
    assert_eq!(partition_stream(1), "rb:events:{1}");
    assert_eq!(dead_letter_stream(), "rb:events:dead");
}
