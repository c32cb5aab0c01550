//! Which versions of tsoracle work together in a fleet, and at what version of the protocol.
//!
//! A member says its version in its hello; the oracle answers with the version it speaks to
//! that member ([`oracle_speaks`]): its own, or the member's when the member is one minor
//! version older. So a fleet is upgraded one cluster at a time, the oracle first: an oracle
//! serves members of its own minor version and of the one before, never a newer one (it
//! cannot know what a newer member expects), never one two minors apart. The member accepts
//! an answer in its own minor version only ([`member_accepts`]), as every release since 0.5
//! does.
//!
//! The protocol itself (the functions `tsoracle.member_*` a member calls, their arguments and
//! result columns) changes only in a new minor version, and a new oracle keeps answering the
//! previous minor version's calls as that version did.

use std::fmt;

/// A version `MAJOR.MINOR[.PATCH]` (a pre-release or build suffix on the patch is ignored).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

/// The part of a version the protocol is named by: `MAJOR.MINOR`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Protocol {
    pub major: u32,
    pub minor: u32,
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// Why two versions do not work together.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum VersionRefused {
    #[error("{0:?} is not a tsoracle version (MAJOR.MINOR.PATCH)")]
    Unreadable(String),
    #[error("the member runs tsoracle {member}, newer than its oracle's {oracle}")]
    MemberNewer { member: Version, oracle: Version },
    #[error("the member runs tsoracle {member} and its oracle {oracle}: an oracle serves members of its own minor version and of the one before it only")]
    TooFarApart { member: Version, oracle: Version },
    #[error("the oracle speaks tsoracle {spoken} to this member, which runs {own}")]
    NotSpoken { spoken: String, own: Version },
}

impl Version {
    /// Reads `MAJOR.MINOR` or `MAJOR.MINOR.PATCH` (digits; anything after the patch's digits,
    /// such as `-rc1`, is ignored).
    pub fn parse(text: &str) -> Result<Version, VersionRefused> {
        let bad = || VersionRefused::Unreadable(text.to_string());
        let mut parts = text.trim().splitn(3, '.');
        let number = |s: Option<&str>| s.and_then(|s| s.parse::<u32>().ok());
        let major = number(parts.next()).ok_or_else(bad)?;
        let minor = number(parts.next()).ok_or_else(bad)?;
        let patch = match parts.next() {
            None => 0,
            Some(rest) => {
                let digits: &str =
                    &rest[..rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len())];
                digits.parse::<u32>().map_err(|_| bad())?
            }
        };
        Ok(Version { major, minor, patch })
    }

    pub fn protocol(self) -> Protocol {
        Protocol { major: self.major, minor: self.minor }
    }
}

/// On the oracle: the protocol it speaks to a member of version `member`, or why it serves it
/// not at all. Its own when they share a minor version; the member's when the member is one
/// minor version older (same major).
pub fn oracle_speaks(oracle: Version, member: Version) -> Result<Protocol, VersionRefused> {
    let (o, m) = (oracle.protocol(), member.protocol());
    if m == o {
        return Ok(o);
    }
    if m > o {
        return Err(VersionRefused::MemberNewer { member, oracle });
    }
    if m.major == o.major && m.minor + 1 == o.minor {
        return Ok(m);
    }
    Err(VersionRefused::TooFarApart { member, oracle })
}

/// On a member of version `own`: whether the oracle's answer `spoken` (the version it speaks to
/// this member) is one it can follow: its own minor version.
pub fn member_accepts(own: Version, spoken: &str) -> Result<Protocol, VersionRefused> {
    let refused = || VersionRefused::NotSpoken { spoken: spoken.to_string(), own };
    let spoken = Version::parse(spoken).map_err(|_| refused())?.protocol();
    if spoken == own.protocol() {
        Ok(spoken)
    } else {
        Err(refused())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn v(text: &str) -> Version {
        Version::parse(text).expect(text)
    }

    #[test]
    fn parses_what_cargo_and_older_releases_write() {
        assert_eq!(v("0.5.0"), Version { major: 0, minor: 5, patch: 0 });
        assert_eq!(v("0.6"), Version { major: 0, minor: 6, patch: 0 });
        assert_eq!(v("1.2.3-rc1"), Version { major: 1, minor: 2, patch: 3 });
        for bad in ["", "0", "x.1", "0.x", "0.5.x", "-1.2", "0..1"] {
            assert!(Version::parse(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn a_rolling_upgrade_from_0_5_to_0_6() {
        // The oracle first: it speaks 0.5 to the members not yet upgraded.
        assert_eq!(oracle_speaks(v("0.6.0"), v("0.5.0")).map(|p| p.to_string()), Ok("0.5".into()));
        assert_eq!(oracle_speaks(v("0.6.0"), v("0.6.1")).map(|p| p.to_string()), Ok("0.6".into()));
        // What a 0.5.0 member checks of the answer (the same minor version) passes.
        assert!(member_accepts(v("0.5.0"), "0.5").is_ok());
        // A member upgraded before its oracle is refused by a 0.6 oracle as by a 0.5 one.
        assert!(matches!(
            oracle_speaks(v("0.6.0"), v("0.7.0")),
            Err(VersionRefused::MemberNewer { .. })
        ));
        assert!(matches!(
            oracle_speaks(v("0.6.0"), v("0.4.2")),
            Err(VersionRefused::TooFarApart { .. })
        ));
        assert!(matches!(
            oracle_speaks(v("1.0.0"), v("0.9.0")),
            Err(VersionRefused::TooFarApart { .. })
        ));
        assert!(member_accepts(v("0.6.0"), "0.5.0").is_err());
        assert!(member_accepts(v("0.6.0"), "nonsense").is_err());
    }

    proptest! {
        /// Whatever the oracle speaks, the member accepts it, and it is never newer than the
        /// member (the oracle never asks a member for what it does not know) nor more than one
        /// minor version below the oracle.
        #[test]
        fn what_the_oracle_speaks_the_member_follows(
            om in 0u32..3, on in 0u32..12, op in 0u32..4,
            mm in 0u32..3, mn in 0u32..12, mp in 0u32..4,
        ) {
            let oracle = Version { major: om, minor: on, patch: op };
            let member = Version { major: mm, minor: mn, patch: mp };
            match oracle_speaks(oracle, member) {
                Ok(spoken) => {
                    prop_assert_eq!(member_accepts(member, &spoken.to_string()), Ok(spoken));
                    prop_assert!(spoken <= oracle.protocol());
                    prop_assert_eq!(spoken, member.protocol());
                    prop_assert_eq!(mm, om);
                    prop_assert!(on - mn <= 1);
                }
                Err(VersionRefused::MemberNewer { .. }) => {
                    prop_assert!(member.protocol() > oracle.protocol())
                }
                Err(VersionRefused::TooFarApart { .. }) => {
                    prop_assert!(member.protocol() < oracle.protocol());
                    prop_assert!(mm != om || on - mn >= 2);
                }
                Err(e) => prop_assert!(false, "unexpected {e}"),
            }
        }

        /// The text form reads back.
        #[test]
        fn versions_read_back(major in 0u32..100, minor in 0u32..100, patch in 0u32..100) {
            let version = Version { major, minor, patch };
            prop_assert_eq!(Version::parse(&version.to_string()), Ok(version));
            prop_assert_eq!(Version::parse(&version.protocol().to_string()).map(Version::protocol), Ok(version.protocol()));
        }
    }
}
