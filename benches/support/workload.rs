//! The benches' tip workloads: which room (and fan) event `i` goes to, the event itself, as
//! the apply script takes it and as stream fields, and the fill of a stream with them.

use fred::prelude::*;
use rollboard::store::ApplyEvent;

/// Uniform workload's rooms.
pub const MEMBERS: usize = 100_000;

/// How tips spread over rooms (and fans).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spread {
    /// A power law over SKEWED_ROOMS rooms, as live tipping is: a few rooms take most tips.
    Skewed,
    /// Every one of MEMBERS rooms equally likely: nearly every event touches a new member.
    Uniform,
    /// The shipped config's shape: rooms as `Skewed`, and within a room a power law over
    /// FANS_PER_ROOM fans; two boards per event; event times spread over the last 5 days.
    Shipped,
    /// The shipped shape with every event time within the last minute, as on a live
    /// platform: a batch's events of one member fall in one slice.
    ShippedNow,
}

/// Rooms of the skewed workloads.
pub const SKEWED_ROOMS: usize = 10_000;
/// Fans a room of the shipped shape draws from.
pub const FANS_PER_ROOM: usize = 2_000;

/// A fixed pseudo-random number in [0, 1) for event `i` (splitmix64 finaliser).
fn unit(i: usize, salt: u64) -> f64 {
    let mut x = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ salt;
    x ^= x >> 29;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 32;
    (x >> 11) as f64 / (1u64 << 53) as f64
}

impl Spread {
    pub fn room(self, i: usize) -> usize {
        match self {
            Spread::Uniform => (i * 7919) % MEMBERS,
            // u^4 piles the mass on low ids.
            Spread::Skewed | Spread::Shipped | Spread::ShippedNow => {
                (unit(i, 0x5851_F42D_4C95_7F2D).powi(4) * SKEWED_ROOMS as f64) as usize
            }
        }
    }

    /// The fan of event `i` (shipped shape): a power law within the room, fan names shared
    /// across rooms.
    pub fn user(self, i: usize) -> String {
        let k = (unit(i, 0x2545_F491_4F6C_DD1D).powi(3) * FANS_PER_ROOM as f64) as usize;
        format!("fan{}", (self.room(i) * 7 + k) % 1_000_000)
    }

    pub fn rooms(self) -> usize {
        match self {
            Spread::Uniform => MEMBERS,
            Spread::Skewed | Spread::Shipped | Spread::ShippedNow => SKEWED_ROOMS,
        }
    }

    /// The shape of config/rollboard.toml: two boards per event, `fans_7d` scoped by room.
    pub fn is_shipped(self) -> bool {
        matches!(self, Spread::Shipped | Spread::ShippedNow)
    }

    /// How long before `now` event `i` happened (ms): within the last day on one board,
    /// the last 5 days on the shipped shape, the last minute on `ShippedNow`.
    fn age(self, i: usize) -> i64 {
        let i = i as i64;
        match self {
            Spread::Skewed | Spread::Uniform => (i * 431) % 86_400_000,
            Spread::Shipped => (i * 2_161) % (5 * 86_400_000),
            Spread::ShippedNow => (i * 7) % 60_000,
        }
    }

    pub fn describe(self) -> String {
        match self {
            Spread::Uniform => format!("uniform over {MEMBERS} rooms, one board"),
            Spread::Skewed => format!("power law over {SKEWED_ROOMS} rooms, one board"),
            Spread::Shipped => format!(
                "shipped shape: rooms_7d + fans_7d scoped by room, power law over \
                 {SKEWED_ROOMS} rooms and {FANS_PER_ROOM} fans per room, ts over the last 5 days"
            ),
            Spread::ShippedNow => format!(
                "shipped shape, every ts within the last minute: rooms_7d + fans_7d scoped by \
                 room, power law over {SKEWED_ROOMS} rooms and {FANS_PER_ROOM} fans per room"
            ),
        }
    }
}

/// Event `i`: a tip of 1..=50 to a room, as long ago as `spread` says ([`Spread::age`]).
pub fn apply_event(spread: Spread, i: usize, now: i64) -> ApplyEvent {
    ApplyEvent {
        id: format!("e{i}"),
        ts: now - spread.age(i),
        member: format!("room{}", spread.room(i)),
        amount: 1 + (i % 50) as i64,
    }
}

/// The same event as stream fields.
pub fn fields(spread: Spread, i: usize, now: i64) -> Vec<(String, String)> {
    let e = apply_event(spread, i, now);
    let mut f = vec![
        ("room".into(), e.member),
        ("amount".into(), e.amount.to_string()),
        ("id".into(), e.id),
        ("ts".into(), e.ts.to_string()),
    ];
    if spread.is_shipped() {
        f.push(("user".into(), spread.user(i)));
    }
    f
}

/// XADDs events `from..to` (in flights of 1000).
pub async fn fill_stream(
    client: &Client,
    stream: &str,
    spread: Spread,
    from: usize,
    to: usize,
    now: i64,
) -> Result<(), String> {
    let indexes: Vec<usize> = (from..to).collect();
    for chunk in indexes.chunks(1000) {
        futures_util::future::try_join_all(chunk.iter().map(|i| {
            client.xadd::<String, _, _, _, _>(stream, false, None, "*", fields(spread, *i, now))
        }))
        .await
        .map_err(|e| e.to_string())?;
    }
    Ok(())
}
