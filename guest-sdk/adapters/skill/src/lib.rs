//! The generic Skill component shipped inside `toolgate`: `toolgate skill
//! pack` writes a Skill's content into its `toolgate-pinned` section; it
//! describes itself from that data and serves it. No code per Skill.

toolgate_sdk::export_adapter!(toolgate_sdk::skill::SkillAdapter);
