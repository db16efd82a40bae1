//! farout-train
