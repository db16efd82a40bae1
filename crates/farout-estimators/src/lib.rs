//! farout-estimators
